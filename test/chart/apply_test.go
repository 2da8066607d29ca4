/*
Copyright 2026 The flashsale-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package chart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// warnings collects the API server's warnings (deprecations, Pod Security
// violations of a workload's template, unknown fields).
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.list
	w.list = nil
	return out
}

// monitoringCRDs are the Prometheus Operator's own ServiceMonitor, PodMonitor
// and PrometheusRule CRDs (hack/build-tool.sh monitoring-crds, from its
// module at a pinned version), so the API server checks the chart's objects
// against their real schemas: a misspelt or misplaced field is refused or
// warned about, as on a cluster running the operator.
func monitoringCRDs(t *testing.T) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	dir := tool(t, "monitoring-crds")
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, kind := range []string{"servicemonitors", "podmonitors", "prometheusrules"} {
		raw, err := os.ReadFile(filepath.Join(dir, "monitoring.coreos.com_"+kind+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := utilyaml.Unmarshal(raw, crd); err != nil {
			t.Fatalf("the %s CRD: %v", kind, err)
		}
		out = append(out, crd)
	}
	return out
}

// applyEnv is one API server for the apply tests, with the monitoring CRDs
// and the namespaces the manifests go into, which enforce and warn on the
// restricted Pod Security Standard.
type applyEnv struct {
	c    client.Client
	warn *warnings
}

func startApplyEnv(t *testing.T) *applyEnv {
	t.Helper()
	kube := testharness.KubeT(t)
	cfg := rest.CopyConfig(kube.Config)
	w := &warnings{}
	cfg.WarningHandler = w
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	crds := monitoringCRDs(t)
	for _, crd := range crds {
		if err := c.Create(ctx, crd); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"flashsale-system", "shop", "outlet"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted",
			"pod-security.kubernetes.io/warn":    "restricted",
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	// The CRDs become servable a moment after they are created.
	testharness.Eventually(t, 30*time.Second, "the monitoring CRDs to be established", func() bool {
		for _, crd := range crds {
			var got apiextensionsv1.CustomResourceDefinition
			if c.Get(ctx, client.ObjectKeyFromObject(crd), &got) != nil || !established(&got) {
				return false
			}
		}
		return true
	})
	w.take()
	return &applyEnv{c: c, warn: w}
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// dryRunApply applies every object server-side as a dry run and returns the
// errors and warnings, each naming its object.
func (e *applyEnv) dryRunApply(t *testing.T, objs []*unstructured.Unstructured) (errs, warns []string) {
	t.Helper()
	ctx := context.Background()
	e.warn.take()
	for _, o := range objs {
		id := fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
		// A restmapper that has not seen a just-established CRD retries.
		var err error
		for range 20 {
			err = e.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.DryRunAll, client.FieldOwner("flashsale-chart-test"), client.ForceOwnership)
			if !meta.IsNoMatchError(err) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, id+": "+err.Error())
		}
		for _, w := range e.warn.take() {
			warns = append(warns, id+": "+w)
		}
	}
	return errs, warns
}

// TestManifestsApplyServerSide applies the rendered chart (default values,
// namespaced mode, everything on) and dist/install.yaml server-side as dry
// runs: the API server accepts every object, without a warning, and the
// manager's pod meets the restricted Pod Security Standard.
func TestManifestsApplyServerSide(t *testing.T) {
	e := startApplyEnv(t)
	install, err := os.ReadFile(filepath.Join(testharness.RepoRoot(), "dist", "install.yaml"))
	if err != nil {
		t.Fatalf("dist/install.yaml: %v (run make build-installer)", err)
	}
	for _, c := range []struct {
		name string
		objs []*unstructured.Unstructured
	}{
		{"chart defaults", render(t)},
		{"chart namespaced, two replicas", render(t, "watchNamespaces={shop,outlet}", "replicaCount=2")},
		{"chart with monitoring", render(t, "monitoring.serviceMonitor.enabled=true", "monitoring.podMonitors.enabled=true",
			"monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true",
			"metrics.readerSubjects[0].kind=ServiceAccount", "metrics.readerSubjects[0].name=prometheus", "metrics.readerSubjects[0].namespace=monitoring")},
		{"chart with monitoring, a token Secret", render(t, "monitoring.serviceMonitor.enabled=true", "monitoring.serviceMonitor.tokenSecret.name=scraper-token")},
		{"chart with monitoring, a metrics certificate", render(t, "monitoring.serviceMonitor.enabled=true", "metrics.certSecret=metrics-tls", "replicaCount=2")},
		{"dist/install.yaml", withoutNamespaceObject(t, decode(t, string(install)))},
	} {
		errs, warns := e.dryRunApply(t, c.objs)
		for _, s := range append(errs, warns...) {
			t.Errorf("%s: %s", c.name, s)
		}
		if len(c.objs) < 5 {
			t.Errorf("%s: only %d objects", c.name, len(c.objs))
		}
	}
}

// withoutNamespaceObject drops install.yaml's Namespace, made for real by
// startApplyEnv already (a dry run cannot make the namespace the rest go in),
// after checking it enforces the restricted standard.
func withoutNamespaceObject(t *testing.T, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			if o.GetLabels()["pod-security.kubernetes.io/enforce"] != "restricted" {
				t.Errorf("install.yaml's Namespace %s does not enforce the restricted Pod Security Standard", o.GetName())
			}
			continue
		}
		out = append(out, o)
	}
	return out
}

// TestApplyCatchesPodSecurityViolations: the dry run reports a manager pod
// that breaks the restricted standard, so TestManifestsApplyServerSide can
// fail on one.
func TestApplyCatchesPodSecurityViolations(t *testing.T) {
	e := startApplyEnv(t)
	var deployment []*unstructured.Unstructured
	for _, o := range render(t, "securityContext.allowPrivilegeEscalation=true") {
		if o.GetKind() == "Deployment" {
			deployment = append(deployment, o)
		}
	}
	_, warns := e.dryRunApply(t, deployment)
	if len(warns) == 0 || !strings.Contains(strings.Join(warns, "\n"), "allowPrivilegeEscalation") {
		t.Fatalf("a manager allowing privilege escalation applied with warnings %q, want a Pod Security warning", warns)
	}
}

// TestApplyCatchesMonitoringSchemaErrors: the monitoring CRDs are the real
// ones, so a ServiceMonitor with an interval that is no duration and a field
// the Prometheus Operator does not have is refused or warned about: what
// TestManifestsApplyServerSide passes, a cluster running the operator takes.
func TestApplyCatchesMonitoringSchemaErrors(t *testing.T) {
	e := startApplyEnv(t)
	for field, value := range map[string]string{"interval": "soon", "bearerTokenPath": "/token"} {
		sm := find(t, render(t, "monitoring.serviceMonitor.enabled=true"), "ServiceMonitor", "-manager")
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		eps[0].(map[string]any)[field] = value
		if err := unstructured.SetNestedSlice(sm.Object, eps, "spec", "endpoints"); err != nil {
			t.Fatal(err)
		}
		errs, warns := e.dryRunApply(t, []*unstructured.Unstructured{sm})
		if all := strings.Join(append(errs, warns...), "\n"); !strings.Contains(all, field) {
			t.Errorf("a ServiceMonitor with %s %q applied: errors %q, warnings %q", field, value, errs, warns)
		}
	}
}
