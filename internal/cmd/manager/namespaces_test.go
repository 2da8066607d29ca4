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
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// A manager scoped to namespaces as the chart installs it (the generated rules
// in a Role of each watched namespace; cluster-wide only the FlashSales and
// the watched Namespaces by name) starts after one of them went with its Role
// (a namespace deleted): it reconciles the sales of the others instead of
// waiting for a cache that never syncs and stopping, and stops (to be
// restarted) once that namespace is readable again. With none left to read,
// it says so at once.
func TestRunStartsWithoutANamespaceItMayNotRead(t *testing.T) {
	kube := testharness.KubeT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, err := client.New(kube.Config, client.Options{Scheme: NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	create := func(o client.Object) {
		t.Helper()
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	inNamespace, clusterWide := testharness.ScopedManagerRules(t, "shop", "gone")
	const user = "flashsale-scoped"
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	create(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "flashsale-manager", Namespace: "shop"}, Rules: inNamespace})
	create(&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "flashsale-manager", Namespace: "shop"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "flashsale-manager"}, Subjects: subjects})
	create(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "flashsale-cleanup"}, Rules: clusterWide})
	create(&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "flashsale-cleanup"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "flashsale-cleanup"}, Subjects: subjects})
	au, err := kube.AddUser(envtest.User{Name: user}, kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	// Its Secrets do not exist: reconciled, it says so in Ready.
	create(&flashsalev1alpha1.FlashSale{
		ObjectMeta: metav1.ObjectMeta{Name: "still-here", Namespace: "shop"},
		Spec: flashsalev1alpha1.FlashSaleSpec{
			SKU: "itm-still-here", Allocation: 10,
			Redis:     flashsalev1alpha1.RedisSpec{SecretRef: flashsalev1alpha1.SecretNameReference{Name: "none"}},
			Postgres:  flashsalev1alpha1.PostgresSpec{SecretRef: flashsalev1alpha1.PostgresSecretKeySelector{Name: "none"}},
			Admission: flashsalev1alpha1.AdmissionSpec{SecretRef: flashsalev1alpha1.AdmissionSecretKeySelector{Name: "none"}},
		},
	})

	opts := DefaultOptions()
	opts.HealthProbeBindAddress = freeAddr(t)
	opts.MetricsBindAddress = "0"
	opts.skipNameValidation = true
	opts.Namespaces = []string{"gone"}
	if err := Run(ctx, au.Config(), opts); err == nil || !strings.Contains(err.Error(), "may read none of the namespaces") {
		t.Fatalf("Run with no namespace it may read = %v, want an error saying so", err)
	}

	opts.Namespaces = []string{"gone", "shop"}
	opts.namespaceRecheckEvery = 200 * time.Millisecond
	opts.MetricsBindAddress, opts.MetricsSecure = freeAddr(t), false
	done := make(chan error, 1)
	go func() { done <- Run(ctx, au.Config(), opts) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var fs flashsalev1alpha1.FlashSale
		if err := admin.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "still-here"}, &fs); err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c != nil && c.Reason == "SecretNotFound" {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned %v before reconciling the sale of the namespace it may read", err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sale of the namespace it may read was not reconciled in 30s: %+v", fs.Status)
		}
	}

	// The metrics name the namespace left out, and only it.
	metrics := "http://" + opts.MetricsBindAddress + "/metrics"
	if err := waitAnswer(metrics, "", done, "the unwatched namespace", func(code int, body string) bool {
		return code == http.StatusOK && strings.Contains(body, `flashsale_operator_namespace_unwatched{namespace="gone"} 1`) &&
			!strings.Contains(body, `flashsale_operator_namespace_unwatched{namespace="shop"}`)
	}); err != nil {
		t.Fatal(err)
	}

	// The namespace comes back with its Role (a helm upgrade of the same
	// values, which does not restart the manager): the manager stops, for
	// its pod to restart and watch it.
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gone"}})
	create(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "flashsale-manager", Namespace: "gone"}, Rules: inNamespace})
	create(&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "flashsale-manager", Namespace: "gone"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "flashsale-manager"}, Subjects: subjects})
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "[gone]") || !strings.Contains(err.Error(), "readable now") {
			t.Fatalf("Run returned %v once the namespace left out was readable, want an error naming it", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run went on for 30s after the namespace left out became readable")
	}
}
