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

package manager

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	runtimeconfig "github.com/flashsale-dev/flashsale-operator/runtime/config"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := testharness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

// TestRunServesProbesAndStopsOnCancel starts the manager against a real API
// server as a user holding only the ClusterRole `make manifests` generates,
// waits for its probes, checks that its metrics answer only callers the API
// server allows to get /metrics (the shipped metrics-reader ClusterRole), then
// cancels its context as SIGTERM does and expects a clean return.
func TestRunServesProbesAndStopsOnCancel(t *testing.T) {
	kube := testharness.KubeT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, err := kubernetes.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	bindClusterRole := func(file string, subject rbacv1.Subject) {
		t.Helper()
		var role rbacv1.ClusterRole
		readManifest(t, file, &role)
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role.Name + "-" + subject.Name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{subject},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	user, err := kube.AddUser(envtest.User{Name: "flashsale-manager"}, kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	bindClusterRole("config/rbac/role.yaml", rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "flashsale-manager"})

	// Callers of the metrics: an account without the metrics-reader role and
	// one with it (Prometheus's). Bound before the manager starts, and seen
	// by the API server's authorizer before the first scrape: a deny is
	// cached by the manager for 30 s.
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(account string) string {
		t.Helper()
		if _, err := admin.CoreV1().ServiceAccounts("monitoring").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: account}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := admin.CoreV1().ServiceAccounts("monitoring").CreateToken(ctx, account, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	stranger, scraper := token("stranger"), token("prometheus")
	bindClusterRole("config/rbac/metrics_reader_role.yaml", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "monitoring", Name: "prometheus"})
	allowed := func(sar *authorizationv1.SubjectAccessReview) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			res, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err == nil && res.Status.Allowed {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not allowed %+v: %v", sar.Spec.User, sar.Spec, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	allowed(&authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: "system:serviceaccount:monitoring:prometheus", Groups: []string{"system:serviceaccounts"},
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
	}})
	allowed(&authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "flashsale-manager",
		ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "authentication.k8s.io", Resource: "tokenreviews", Verb: "create"},
	}})

	opts := DefaultOptions()
	opts.HealthProbeBindAddress = freeAddr(t)
	opts.MetricsBindAddress = freeAddr(t)
	opts.Namespaces = []string{"shop", " ", "outlet"}
	opts.skipNameValidation = true // go test -count=2 runs this again in the process
	done := make(chan error, 1)
	go func() { done <- Run(ctx, user.Config(), opts) }()

	for _, url := range []string{
		"http://" + opts.HealthProbeBindAddress + "/healthz",
		"http://" + opts.HealthProbeBindAddress + "/readyz",
	} {
		if err := waitStatus(url, "", http.StatusOK, done); err != nil {
			t.Fatal(err)
		}
	}

	metrics := "https://" + opts.MetricsBindAddress + "/metrics"
	for _, c := range []struct {
		who, token string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"an account without the role", stranger, http.StatusForbidden},
		{"the scraper", scraper, http.StatusOK},
	} {
		if err := waitStatus(metrics, c.token, c.want, done); err != nil {
			t.Fatalf("%s: %v", c.who, err)
		}
	}
	// Plain HTTP gets the TLS listener's 400, not the metrics.
	if resp, err := http.Get("http://" + opts.MetricsBindAddress + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("metrics served over plain HTTP")
		}
	}

	// HTTP/2 is off unless --enable-http2: a client offering h2 gets HTTP/1.1.
	if proto := negotiatedProtocol(t, opts.MetricsBindAddress); proto != "http/1.1" {
		t.Fatalf("the metrics server negotiated %q with a client offering h2, want http/1.1 (--enable-http2 is off)", proto)
	}

	// A sale in a watched namespace shows in the metrics with its status: its
	// Secrets do not exist, so it is not Ready.
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(kube.Config, client.Options{Scheme: NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &flashsalev1alpha1.FlashSale{
		ObjectMeta: metav1.ObjectMeta{Name: "metered", Namespace: "shop"},
		Spec: flashsalev1alpha1.FlashSaleSpec{
			SKU: "itm-metered", Allocation: 10,
			Redis:     flashsalev1alpha1.RedisSpec{SecretRef: flashsalev1alpha1.SecretNameReference{Name: "none"}},
			Postgres:  flashsalev1alpha1.PostgresSpec{SecretRef: flashsalev1alpha1.PostgresSecretKeySelector{Name: "none"}},
			Admission: flashsalev1alpha1.AdmissionSpec{SecretRef: flashsalev1alpha1.AdmissionSecretKeySelector{Name: "none"}},
		},
	}); err != nil {
		t.Fatal(err)
	}
	want := `flashsale_sale_condition{condition="Ready",name="metered",namespace="shop",reason="SecretNotFound"} 0`
	if err := waitBody(metrics, scraper, want, done); err != nil {
		t.Fatal(err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v after cancel, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of cancel")
	}
	if _, err := http.Get("http://" + opts.HealthProbeBindAddress + "/healthz"); err == nil {
		t.Error("the probe server still answers after Run returned")
	}
}

// negotiatedProtocol is the ALPN protocol the TLS server at addr picks for a
// client that offers h2 and http/1.1.
func negotiatedProtocol(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{
		InsecureSkipVerify: true, //nolint:gosec // a test against 127.0.0.1
		NextProtos:         []string{"h2", "http/1.1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().NegotiatedProtocol
}

func TestMetricsHTTP2OnlyWhenEnabled(t *testing.T) {
	for _, enable := range []bool{false, true} {
		opts := DefaultOptions()
		opts.EnableHTTP2 = enable
		c := &tls.Config{NextProtos: []string{"h2", "http/1.1"}}
		for _, f := range metricsOptions(opts).TLSOpts {
			f(c)
		}
		hasH2 := false
		for _, p := range c.NextProtos {
			hasH2 = hasH2 || p == "h2"
		}
		if hasH2 != enable {
			t.Errorf("--enable-http2=%v: the metrics server offers %v", enable, c.NextProtos)
		}
	}
}

// readManifest reads one object of the repository's config/ into obj.
func readManifest(t *testing.T, file string, obj any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testharness.RepoRoot(), file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, obj); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// waitBody waits until url's answer (with the bearer token) is a 200 that
// holds want.
func waitBody(url, token, want string, done <-chan error) error {
	return waitAnswer(url, token, done, fmt.Sprintf("200 holding %s", want), func(code int, body string) bool {
		return code == http.StatusOK && strings.Contains(body, want)
	})
}

// waitStatus waits until url answers want (with the bearer token, if any).
func waitStatus(url, token string, want int, done <-chan error) error {
	return waitAnswer(url, token, done, strconv.Itoa(want), func(code int, _ string) bool { return code == want })
}

// waitAnswer polls url (with the bearer token, if any) for 20 s until ok
// holds of an answer, or Run returns.
func waitAnswer(url, token string, done <-chan error, what string, ok func(code int, body string) bool) error {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// The metrics server's certificate is self-signed.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a test against 127.0.0.1
	}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(20 * time.Second)
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return fmt.Errorf("Run returned early: %v", err)
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if ok(resp.StatusCode, string(body)) {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer %s within 20s (last: %s)", url, what, last)
}

func TestSchemeKnowsFlashSale(t *testing.T) {
	gvks, _, err := NewScheme().ObjectKinds(&flashsalev1alpha1.FlashSale{})
	if err != nil || len(gvks) != 1 || gvks[0] != flashsalev1alpha1.GroupVersion.WithKind("FlashSale") {
		t.Fatalf("scheme kinds %v, err %v", gvks, err)
	}
}

func TestNamespacesFlag(t *testing.T) {
	cmd := NewCmd()
	if err := cmd.ParseFlags([]string{"--namespaces=shop, outlet,", "--leader-elect", "--kubeconfig=/dev/null"}); err != nil {
		t.Fatal(err)
	}
	ns, err := cmd.Flags().GetStringSlice("namespaces")
	if err != nil {
		t.Fatal(err)
	}
	got := watchedNamespaces(ns)
	if len(got) != 2 || got[0] != "shop" || got[1] != "outlet" {
		t.Errorf("namespaces %q, want [shop outlet]", got)
	}
	if got := installName(true, "flashsale-system", LeaderElectionID); got != "flashsale-system/flashsale-manager.flashsale.dev" {
		t.Errorf("install name %q", got)
	}
	for name, want := range map[string]string{
		"leader-election-id":        LeaderElectionID,
		"metrics-bind-address":      ":8443",
		"metrics-secure":            "true",
		"health-probe-bind-address": ":8081",
		"leader-elect":              "true",
	} {
		if got := cmd.Flags().Lookup(name).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
}

// The container's memory limit comes from the variable the manifests set
// from limits.memory, and a value that is not a count of bytes stops the
// start, naming the variable.
func TestMemoryLimitFlag(t *testing.T) {
	t.Setenv(runtimeconfig.EnvMemoryLimit, "268435456")
	cmd := NewCmd()
	if err := cmd.ParseFlags([]string{"--kubeconfig=/dev/null"}); err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("memory-limit").Value.String(); got != "268435456" {
		t.Errorf("--memory-limit = %s, want the variable's 268435456", got)
	}
	t.Setenv(runtimeconfig.EnvMemoryLimit, "256Mi")
	cmd = NewCmd()
	cmd.SetArgs([]string{"--kubeconfig=/dev/null"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), runtimeconfig.EnvMemoryLimit) {
		t.Errorf("start with %s=256Mi: %v, want an error naming it", runtimeconfig.EnvMemoryLimit, err)
	}
}

// An API server that cannot be reached stops the start with an error that
// says so (the pod restarts with back-off), instead of a manager that looks
// alive and reconciles nothing.
func TestRunFailsWithoutAnAPIServer(t *testing.T) {
	opts := DefaultOptions()
	opts.HealthProbeBindAddress = freeAddr(t)
	opts.MetricsBindAddress = "0"
	cfg := &rest.Config{Host: "http://" + freeAddr(t)} // nothing listens there
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := Run(ctx, cfg, opts)
	if err == nil || !strings.Contains(err.Error(), "creating the manager") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Run = %v, want an error creating the manager: connection refused", err)
	}
}

func TestRunRefusesBadConcurrencySettings(t *testing.T) {
	for _, mutate := range []func(*Options){
		func(o *Options) { o.MaxConcurrentReconciles = 0 },
		func(o *Options) { o.ReconcileTimeout = 0 },
	} {
		opts := DefaultOptions()
		mutate(&opts)
		err := Run(context.Background(), &rest.Config{Host: "http://" + freeAddr(t)}, opts)
		if err == nil || !strings.Contains(err.Error(), "--max-concurrent-reconciles must be at least 1") {
			t.Fatalf("Run = %v", err)
		}
	}
	for _, phase := range []time.Duration{0, time.Millisecond} {
		opts := DefaultOptions()
		opts.PhaseTimeout = phase
		if err := Run(context.Background(), &rest.Config{Host: "http://" + freeAddr(t)}, opts); err == nil || !strings.Contains(err.Error(), "--phase-timeout") {
			t.Fatalf("Run with --phase-timeout %s = %v", phase, err)
		}
	}
	for _, id := range []string{"", "Outlet_Operator"} {
		opts := DefaultOptions()
		opts.LeaderElect, opts.LeaderElectionID = true, id
		if err := Run(context.Background(), &rest.Config{Host: "http://" + freeAddr(t)}, opts); err == nil || !strings.Contains(err.Error(), "--leader-election-id") {
			t.Fatalf("Run with --leader-election-id %q = %v", id, err)
		}
	}
	for _, refresh := range []time.Duration{0, -time.Second, time.Millisecond, 2 * time.Minute} {
		opts := DefaultOptions()
		opts.StatusRefresh = refresh
		if err := Run(context.Background(), &rest.Config{Host: "http://" + freeAddr(t)}, opts); err == nil || !strings.Contains(err.Error(), "--status-refresh must be between 100ms and 1m") {
			t.Fatalf("Run with --status-refresh %s = %v", refresh, err)
		}
	}
}
