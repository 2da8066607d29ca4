{{/* Name of the chart, overridable. */}}
{{- define "flashsale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object's name. */}}
{{- define "flashsale.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "flashsale.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "flashsale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flashsale-operator
{{- end }}

{{- define "flashsale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flashsale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end }}

{{- define "flashsale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "flashsale.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The one image reference: the manager's container and FLASHSALE_IMAGE (the
sale pods' image). A digest wins over the tag; the tag defaults to appVersion.
*/}}
{{- define "flashsale.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The manager's rules, as `make manifests` generates them into
config/rbac/role.yaml, less the token and access reviews unless secure
metrics need them: creating a TokenReview is a cluster-wide grant no other
part of the manager uses.
*/}}
{{- define "flashsale.managerRules" -}}
{{- $out := list }}
{{- $reviews := and .Values.metrics.enabled .Values.metrics.secure }}
{{- range (.Files.Get "files/manager-role.yaml" | fromYaml).rules }}
{{- if or $reviews (not (or (has "authentication.k8s.io" .apiGroups) (has "authorization.k8s.io" .apiGroups))) }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- $out | toYaml }}
{{- end }}

{{/* The manager's rules on namespaced resources only (for per-namespace Roles). */}}
{{- define "flashsale.namespacedRules" -}}
{{- $out := list }}
{{- range (.Files.Get "files/manager-role.yaml" | fromYaml).rules }}
{{- if not (has "authentication.k8s.io" .apiGroups) }}
{{- if not (has "authorization.k8s.io" .apiGroups) }}
{{- if not (has "namespaces" .resources) }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $out | toYaml }}
{{- end }}

{{/*
With watchNamespaces, the manager's rules that must outlive a watched
namespace's Role (its deletion removes the Role before the sales): the
FlashSales, to remove their finalizer, and the watched Namespaces by name, to
tell that they are being deleted.
*/}}
{{- define "flashsale.cleanupRules" -}}
{{- $out := list }}
{{- range (.Files.Get "files/manager-role.yaml" | fromYaml).rules }}
{{- if and (has "flashsale.dev" .apiGroups) (has "flashsales" .resources) }}
{{- $out = append $out . }}
{{- else if and (has "namespaces" .resources) (eq (len .resources) 1) }}
{{- $out = append $out (set (deepCopy .) "resourceNames" $.Values.watchNamespaces) }}
{{- end }}
{{- end }}
{{- $out | toYaml }}
{{- end }}

{{- define "flashsale.leaderElect" -}}
{{- if .Values.leaderElection.enabled }}true{{ end }}
{{- end }}

{{/* The metrics certificate's Secret, when the manager serves HTTPS with one. */}}
{{- define "flashsale.metricsCert" -}}
{{- if and .Values.metrics.enabled .Values.metrics.secure (dig "certSecret" "" .Values.metrics) }}
{{- .Values.metrics.certSecret }}
{{- end }}
{{- end }}
