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
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// kinds counts the rendered objects by kind.
func kinds(objs []*unstructured.Unstructured) map[string]int {
	n := map[string]int{}
	for _, o := range objs {
		n[o.GetKind()]++
	}
	return n
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, nameSuffix string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && strings.HasSuffix(o.GetName(), nameSuffix) {
			return o
		}
	}
	t.Fatalf("no %s named *%s rendered", kind, nameSuffix)
	return nil
}

func as[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	var out T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &out); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return &out
}

// manager is the rendered manager Deployment's container, with its
// FLASHSALE_IMAGE value.
func manager(t *testing.T, objs []*unstructured.Unstructured) (*appsv1.Deployment, string) {
	t.Helper()
	d := as[appsv1.Deployment](t, find(t, objs, "Deployment", "flashsale-operator"))
	c := d.Spec.Template.Spec.Containers[0]
	for _, e := range c.Env {
		if e.Name == "FLASHSALE_IMAGE" {
			return d, e.Value
		}
	}
	t.Fatal("the manager has no FLASHSALE_IMAGE: sale pods would not run its image")
	return nil, ""
}

// TestImageIsOneValue: the manager and the sale pods (FLASHSALE_IMAGE) run
// the same reference, by default the chart's appVersion, never latest.
func TestImageIsOneValue(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, c := range []struct {
		set  []string
		want string
	}{
		{nil, "flashsale-operator:" + appVersion(t)},
		{[]string{"image.repository=registry.example.com/shop/flashsale", "image.tag=v9.8.7"}, "registry.example.com/shop/flashsale:v9.8.7"},
		{[]string{"image.tag=v9.8.7", "image.digest=" + digest}, "flashsale-operator@" + digest},
	} {
		objs := render(t, c.set...)
		d, env := manager(t, objs)
		if got := d.Spec.Template.Spec.Containers[0].Image; got != c.want || env != c.want {
			t.Errorf("values %v: manager image %q, FLASHSALE_IMAGE %q; want both %q", c.set, got, env, c.want)
		}
		for _, o := range objs {
			b, _ := json.Marshal(o.Object)
			if strings.Contains(string(b), ":latest") {
				t.Errorf("values %v: %s %s mentions :latest", c.set, o.GetKind(), o.GetName())
			}
		}
	}
}

// TestBadValuesAreRefused: values the chart cannot honour fail the render
// with a message naming them.
func TestBadValuesAreRefused(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"image.tag=latest"}, "/image/tag"},
		{[]string{"image.digest=sha256:short"}, "/image/digest"},
		{[]string{"replicaCount=2", "leaderElection.enabled=false"}, "needs leaderElection.enabled"},
		{[]string{"watchNamespaces={Not_A_Namespace}"}, "/watchNamespaces/0"},
		{[]string{"extraArgs={status-refresh=5s}"}, "/extraArgs/0"},
		{[]string{"monitoring.prometheusRule.notReadyFor=soon"}, "/monitoring/prometheusRule/notReadyFor"},
		{[]string{"metric.secure=false"}, "'metric' not allowed"},
		// A ServiceAccount subject without a namespace would only be refused
		// by the API server, at install.
		{[]string{"metrics.readerSubjects[0].kind=ServiceAccount", "metrics.readerSubjects[0].name=prometheus"}, "/metrics/readerSubjects/0"},
		{[]string{"monitoring.serviceMonitor.tokenSecret.name=Scraper_Token"}, "/monitoring/serviceMonitor/tokenSecret/name"},
		{[]string{"monitoring.serviceMonitor.tokenSecret.key="}, "/monitoring/serviceMonitor/tokenSecret/key"},
		{[]string{"leaderElection.id=Outlet_Operator"}, "/leaderElection/id"},
		// Alerts on metrics nothing exports: every one silent, one for ever.
		{[]string{"monitoring.prometheusRule.enabled=true", "metrics.enabled=false"}, "needs metrics.enabled"},
	} {
		out, err := template(t, c.set...)
		if err == nil {
			t.Errorf("values %v rendered (%d bytes), want an error mentioning %q", c.set, len(out), c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("values %v: error %v does not mention %q", c.set, err, c.want)
		}
	}
}

// managerRules are the rules `make manifests` generates for the manager.
func managerRules(t *testing.T) []rbacv1.PolicyRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testharness.RepoRoot(), "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var r rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r.Rules
}

func TestClusterWideRBAC(t *testing.T) {
	objs := render(t)
	role := as[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "-manager"))
	if !reflect.DeepEqual(role.Rules, managerRules(t)) {
		t.Errorf("the chart's manager ClusterRole differs from config/rbac/role.yaml (run make manifests):\n%v", role.Rules)
	}
	if n := kinds(objs)["Role"]; n != 1 { // leader election only
		t.Errorf("%d Roles rendered without watchNamespaces, want 1 (leader election)", n)
	}
	// Token and access reviews only serve secure metrics: without them the
	// manager holds every other rule and no cluster-wide create on reviews.
	var rest []rbacv1.PolicyRule
	for _, r := range managerRules(t) {
		if !slices.Contains(r.APIGroups, "authentication.k8s.io") && !slices.Contains(r.APIGroups, "authorization.k8s.io") {
			rest = append(rest, r)
		}
	}
	if len(rest) != len(managerRules(t))-2 {
		t.Fatalf("config/rbac/role.yaml has %d review rules, want 2", len(managerRules(t))-len(rest))
	}
	for _, set := range [][]string{{"metrics.secure=false"}, {"metrics.enabled=false"}} {
		role := as[rbacv1.ClusterRole](t, find(t, render(t, set...), "ClusterRole", "-manager"))
		if !reflect.DeepEqual(role.Rules, rest) {
			t.Errorf("%v: the manager ClusterRole's rules are not role.yaml's less the reviews:\n%v", set, role.Rules)
		}
	}
	d, _ := manager(t, objs)
	args := d.Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"--leader-elect", "--metrics-secure=true", "--enable-http2=false"} {
		if !slices.Contains(args, want) {
			t.Errorf("manager args %v lack %s", args, want)
		}
	}
	for _, a := range args {
		if strings.HasPrefix(a, "--namespaces") {
			t.Errorf("manager args %v restrict namespaces by default", args)
		}
	}
	// The user roles, aggregated into the built-in ones.
	editor := as[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "flashsale-editor"))
	viewer := as[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "flashsale-viewer"))
	if editor.Labels["rbac.authorization.k8s.io/aggregate-to-edit"] != "true" || editor.Labels["rbac.authorization.k8s.io/aggregate-to-admin"] != "true" {
		t.Errorf("flashsale-editor labels %v: not aggregated into edit and admin", editor.Labels)
	}
	if viewer.Labels["rbac.authorization.k8s.io/aggregate-to-view"] != "true" {
		t.Errorf("flashsale-viewer labels %v: not aggregated into view", viewer.Labels)
	}
	for file, role := range map[string]*rbacv1.ClusterRole{"flashsale_editor_role.yaml": editor, "flashsale_viewer_role.yaml": viewer} {
		var want rbacv1.ClusterRole
		b, err := os.ReadFile(filepath.Join(testharness.RepoRoot(), "config", "rbac", file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(role.Rules, want.Rules) {
			t.Errorf("the chart's %s rules differ from config/rbac/%s", role.Name, file)
		}
	}
	for _, r := range viewer.Rules {
		for _, v := range r.Verbs {
			if v != "get" && v != "list" && v != "watch" {
				t.Errorf("flashsale-viewer may %s %v", v, r.Resources)
			}
		}
	}
	if n := kinds(render(t, "rbac.aggregateClusterRoles=false"))["ClusterRole"]; n != kinds(objs)["ClusterRole"]-2 {
		t.Errorf("rbac.aggregateClusterRoles=false left %d ClusterRoles", n)
	}
}

// TestNamespacedMode: with watchNamespaces the manager gets a Role in each
// and no ClusterRole over the sales' resources.
func TestNamespacedMode(t *testing.T) {
	objs := render(t, "watchNamespaces={shop,outlet}")
	d, _ := manager(t, objs)
	if args := d.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--namespaces=shop,outlet") {
		t.Errorf("manager args %v lack --namespaces=shop,outlet", args)
	}
	var inNamespaces []string
	for _, o := range objs {
		switch {
		case o.GetKind() == "ClusterRole" && strings.HasSuffix(o.GetName(), "-manager"):
			t.Errorf("namespaced mode renders the cluster-wide manager ClusterRole %s", o.GetName())
		case o.GetKind() == "Role" && strings.HasSuffix(o.GetName(), "-manager"):
			inNamespaces = append(inNamespaces, o.GetNamespace())
			for _, r := range as[rbacv1.Role](t, o).Rules {
				if slices.Contains(r.Resources, "tokenreviews") || slices.Contains(r.Resources, "subjectaccessreviews") {
					t.Errorf("Role in %s holds cluster-scoped %v", o.GetNamespace(), r.Resources)
				}
			}
		case o.GetKind() == "RoleBinding" && strings.HasSuffix(o.GetName(), "-manager"):
			b := as[rbacv1.RoleBinding](t, o)
			if b.Subjects[0].Namespace != "flashsale-system" {
				t.Errorf("RoleBinding in %s binds %+v, want the release's ServiceAccount", o.GetNamespace(), b.Subjects)
			}
		}
	}
	slices.Sort(inNamespaces)
	if !slices.Equal(inNamespaces, []string{"outlet", "shop"}) {
		t.Errorf("manager Roles in %v, want outlet and shop", inNamespaces)
	}
	// Secure metrics still check tokens cluster-wide.
	find(t, objs, "ClusterRole", "-metrics-auth")
	pm := find(t, render(t, "watchNamespaces={shop}", "monitoring.podMonitors.enabled=true"), "PodMonitor", "-reserve")
	if got, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "namespaceSelector", "matchNames"); !slices.Equal(got, []string{"shop"}) {
		t.Errorf("reserve PodMonitor watches %v, want [shop]", got)
	}
}

// TestNamespacedModeLetsANamespaceDeletionFinish: with watchNamespaces, a
// watched namespace's deletion removes the manager's Role in it before the
// sales, so what finishing their deletion needs is granted cluster-wide:
// the manager's own rule on FlashSales, and get on the watched Namespaces by
// name. Nothing else, and none of it without watchNamespaces (the manager's
// ClusterRole holds it).
func TestNamespacedModeLetsANamespaceDeletionFinish(t *testing.T) {
	objs := render(t, "watchNamespaces={shop,outlet}")
	var want []rbacv1.PolicyRule
	for _, r := range managerRules(t) {
		switch {
		case slices.Equal(r.APIGroups, []string{"flashsale.dev"}) && slices.Equal(r.Resources, []string{"flashsales"}):
			want = append(want, r)
		case slices.Equal(r.Resources, []string{"namespaces"}):
			r.ResourceNames = []string{"shop", "outlet"}
			want = append(want, r)
		}
	}
	if len(want) != 2 {
		t.Fatalf("config/rbac/role.yaml has no rule for flashsales or no rule for namespaces alone: %v", want)
	}
	role := as[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "-manager-cleanup"))
	slices.SortFunc(role.Rules, func(a, b rbacv1.PolicyRule) int { return strings.Compare(a.Resources[0], b.Resources[0]) })
	slices.SortFunc(want, func(a, b rbacv1.PolicyRule) int { return strings.Compare(a.Resources[0], b.Resources[0]) })
	if !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("the cleanup ClusterRole's rules:\n%v\nwant:\n%v", role.Rules, want)
	}
	b := as[rbacv1.ClusterRoleBinding](t, find(t, objs, "ClusterRoleBinding", "-manager-cleanup"))
	if b.RoleRef.Name != role.Name || len(b.Subjects) != 1 || b.Subjects[0].Kind != rbacv1.ServiceAccountKind || b.Subjects[0].Namespace != "flashsale-system" {
		t.Errorf("the cleanup ClusterRoleBinding binds %s to %+v, want the release's ServiceAccount", b.RoleRef.Name, b.Subjects)
	}
	for _, o := range objs {
		if o.GetKind() == "Role" && strings.HasSuffix(o.GetName(), "-manager") {
			for _, r := range as[rbacv1.Role](t, o).Rules {
				if slices.Contains(r.Resources, "namespaces") {
					t.Errorf("Role in %s holds cluster-scoped namespaces", o.GetNamespace())
				}
			}
		}
	}
	for _, o := range render(t) {
		if strings.HasSuffix(o.GetName(), "-manager-cleanup") {
			t.Errorf("%s %s rendered without watchNamespaces", o.GetKind(), o.GetName())
		}
	}
}

// TestMonitoringToggles: the Prometheus Operator objects and the dashboard
// render only when asked for.
func TestMonitoringToggles(t *testing.T) {
	monitoring := []string{"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"}
	off := kinds(render(t))
	for _, k := range monitoring {
		if off[k] != 0 {
			t.Errorf("default values render %d %s", off[k], k)
		}
	}
	objs := render(t, "monitoring.serviceMonitor.enabled=true", "monitoring.podMonitors.enabled=true",
		"monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true")
	on := kinds(objs)
	for k, want := range map[string]int{"ServiceMonitor": 1, "PodMonitor": 2, "PrometheusRule": 1, "ConfigMap": 1} {
		if on[k] != want {
			t.Errorf("monitoring on: %d %s, want %d", on[k], k, want)
		}
	}
	sm := find(t, objs, "ServiceMonitor", "-manager")
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	ep := eps[0].(map[string]any)
	if ep["scheme"] != "https" || ep["honorLabels"] != true {
		t.Errorf("ServiceMonitor endpoint %v: want https (secure metrics) and honorLabels (the sales' namespace label)", ep)
	}
	if ep["bearerTokenFile"] == nil || ep["authorization"] != nil {
		t.Errorf("ServiceMonitor endpoint %v: want Prometheus's own token (bearerTokenFile) by default", ep)
	}
	// A token from a Secret instead, for a Prometheus Operator that denies
	// ServiceMonitors file access.
	sm = find(t, render(t, "monitoring.serviceMonitor.enabled=true", "monitoring.serviceMonitor.tokenSecret.name=scraper-token"), "ServiceMonitor", "-manager")
	eps, _, _ = unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	ep = eps[0].(map[string]any)
	cred, _, _ := unstructured.NestedStringMap(ep, "authorization", "credentials")
	if kind, _, _ := unstructured.NestedString(ep, "authorization", "type"); kind != "Bearer" || cred["name"] != "scraper-token" || cred["key"] != "token" || ep["bearerTokenFile"] != nil {
		t.Errorf("tokenSecret.name=scraper-token: ServiceMonitor endpoint %v, want authorization Bearer from scraper-token/token and no bearerTokenFile", ep)
	}
	// Values without tokenSecret, as `helm upgrade --reuse-values` from a
	// chart without it gives: still a credential, Prometheus's own token.
	sm = find(t, render(t, "monitoring.serviceMonitor.enabled=true", "monitoring.serviceMonitor.tokenSecret=null"), "ServiceMonitor", "-manager")
	eps, _, _ = unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if ep := eps[0].(map[string]any); ep["scheme"] != "https" || ep["bearerTokenFile"] == nil {
		t.Errorf("no tokenSecret value: ServiceMonitor endpoint %v, want https with Prometheus's own token", ep)
	}
	for component, port := range map[string]string{"reserve": "metrics", "sweeper": "http"} {
		pm := find(t, objs, "PodMonitor", "-"+component)
		got, _, _ := unstructured.NestedString(pm.Object, "spec", "selector", "matchLabels", "app.kubernetes.io/component")
		eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
		if got != component || eps[0].(map[string]any)["port"] != port {
			t.Errorf("%s PodMonitor selects %q on port %v, want %q on %q", component, got, eps[0].(map[string]any)["port"], component, port)
		}
	}
	cm := find(t, objs, "ConfigMap", "-dashboard")
	raw, _, _ := unstructured.NestedString(cm.Object, "data", "flashsale.json")
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(raw), &dash); err != nil || len(dash.Panels) == 0 {
		t.Fatalf("the dashboard ConfigMap holds no dashboard JSON: %v", err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, `namespace="$namespace"`) {
				t.Errorf("dashboard panel %q is not per sale: %s", p.Title, tg.Expr)
			}
		}
	}
	// Plain-HTTP metrics: the ServiceMonitor follows.
	sm = find(t, render(t, "metrics.secure=false", "monitoring.serviceMonitor.enabled=true"), "ServiceMonitor", "-manager")
	eps, _, _ = unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if ep := eps[0].(map[string]any); ep["scheme"] != nil || ep["port"] != "http-metrics" {
		t.Errorf("metrics.secure=false: ServiceMonitor endpoint %v", ep)
	}
}

// Without leader election the old manager stops before the new one starts:
// a rolling update would run both, each reconciling every sale.
func TestUpdateStrategyFollowsLeaderElection(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want appsv1.DeploymentStrategyType
	}{
		{nil, ""}, // the Deployment's default, RollingUpdate: the lease hands over
		{[]string{"leaderElection.enabled=false"}, appsv1.RecreateDeploymentStrategyType},
	} {
		d, _ := manager(t, render(t, c.set...))
		if d.Spec.Strategy.Type != c.want {
			t.Errorf("%v: strategy %q, want %q", c.set, d.Spec.Strategy.Type, c.want)
		}
	}
}

// TestLeaderElectionID: a second release in a namespace names its own Lease
// (else one of the two never leads); without a name the manager's default
// stands, and the Lease is only named while leader election is on.
func TestLeaderElectionID(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{nil, ""},
		{[]string{"leaderElection.id=outlet-operator"}, "--leader-election-id=outlet-operator"},
		{[]string{"leaderElection.id=outlet-operator", "leaderElection.enabled=false"}, ""},
	} {
		d, _ := manager(t, render(t, c.set...))
		var got string
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--leader-election-id") {
				got = a
			}
		}
		if got != c.want {
			t.Errorf("%v: %q, want %q", c.set, got, c.want)
		}
	}
}

// TestCRDsAreTheGeneratedOnes: the chart's CRDs are config/crd/bases' (make
// manifests copies them; make verify fails on drift).
func TestCRDsAreTheGeneratedOnes(t *testing.T) {
	bases, err := filepath.Glob(filepath.Join(testharness.RepoRoot(), "config", "crd", "bases", "*.yaml"))
	if err != nil || len(bases) == 0 {
		t.Fatalf("no CRDs in config/crd/bases: %v", err)
	}
	for _, f := range bases {
		want, _ := os.ReadFile(f)
		got, err := os.ReadFile(filepath.Join(chartDir, "crds", filepath.Base(f)))
		if err != nil || string(got) != string(want) {
			t.Errorf("charts/flashsale-operator/crds/%s differs from config/crd/bases (run make manifests): %v", filepath.Base(f), err)
		}
	}
}
