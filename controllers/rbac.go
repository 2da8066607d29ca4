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

package controllers

// The manager's permissions. controller-gen turns these markers into
// config/rbac/role.yaml; keep them least-privilege.

// The finalizer is patched, never updated; status is written through its
// subresource and read with the object.
// +kubebuilder:rbac:groups=flashsale.dev,resources=flashsales,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=flashsale.dev,resources=flashsales/status,verbs=update;patch
// +kubebuilder:rbac:groups=flashsale.dev,resources=flashsales/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;delete
// The reserve and sweeper pods' container states, for Degraded (read only,
// from the cache: listed and watched, never got).
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch
// The event recorder writes events.k8s.io events (leader election has its
// own Role).
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// Whether the install that manages a sale is still there (AnnotationOperator):
// its leader election Lease, read, never written.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get
// Whether a deleted sale's namespace is being deleted too (finalize): read,
// never written.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get

// The metrics endpoint asks the API server who a caller is and whether it may
// get /metrics (--metrics-secure).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
