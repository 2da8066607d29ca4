package controllers_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// deleteNamespace starts the deletion of the test's namespace. The API
// server marks it Terminating and refuses new objects in it; with no
// namespace controller in envtest it stays so, and its content stays until
// the test deletes it, in the namespace controller's stead.
func (e *env) deleteNamespace() {
	e.t.Helper()
	ctx := context.Background()
	if err := k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}); err != nil {
		e.t.Fatal(err)
	}
	testharness.Eventually(e.t, settle, "the namespace Terminating", func() bool {
		var ns corev1.Namespace
		return k8s.Get(ctx, types.NamespacedName{Name: e.ns}, &ns) == nil && ns.Status.Phase == corev1.NamespaceTerminating
	})
}

// deleteObjects deletes objects as the namespace controller would.
func (e *env) deleteObjects(objs ...client.Object) {
	e.t.Helper()
	for _, o := range objs {
		if err := k8s.Delete(context.Background(), o); err != nil {
			e.t.Fatalf("deleting %T %s: %v", o, o.GetName(), err)
		}
	}
}

// saleSecrets are the test's three Secrets.
func (e *env) saleSecrets() []client.Object {
	var out []client.Object
	for _, name := range []string{"shop-redis", "shop-ledger", "waiting-room"} {
		out = append(out, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}})
	}
	return out
}

// A manager installed by the chart with watchNamespaces: the generated rules
// in a Role of the sale's namespace, and cluster-wide only those the chart
// keeps out of it (the FlashSales, and the watched Namespace by name). The
// namespace's deletion removes the Role and the Secrets before the sale: the
// sale still goes, cleaned up with the connections opened before, and the
// children the manager may no longer delete are left to the namespace's
// deletion.
func TestNamespaceDeletionFinishesAfterTheManagersRoleWent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	inNamespace, clusterWide := testharness.ScopedManagerRules(t, e.ns)
	user := "operator-" + e.ns
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "flashsale-manager", Namespace: e.ns}, Rules: inNamespace}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "flashsale-manager", Namespace: e.ns},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}, Subjects: subjects}
	cleanup := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "flashsale-cleanup-" + e.ns}, Rules: clusterWide}
	cleanupBinding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: cleanup.Name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cleanup.Name}, Subjects: subjects}
	for _, o := range []client.Object{role, binding, cleanup, cleanupBinding} {
		e.create(o)
	}
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), cleanupBinding)
		_ = k8s.Delete(context.Background(), cleanup)
	})
	au, err := kube.AddUser(envtest.User{Name: user}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.config = au.Config()
	e.startController()
	fs := e.openSale("nsdel", 10)

	// The namespace controller's order: rbac, then the core Secrets, then
	// the sale.
	e.deleteNamespace()
	e.deleteObjects(binding, role)
	e.deleteObjects(e.saleSecrets()...)
	time.Sleep(time.Second) // the API server's RBAC informer
	e.deleteObjects(fs)
	e.waitGone("nsdel", settle)
	if !cleanedUp(t, e, sharedRedis.Addr(), fs) {
		t.Error("the sale's Redis keys or ledger campaign were left, though its connections were open")
	}
}

// A sale whose Redis lived in its namespace: the namespace's deletion
// removes the Secrets and the Redis before the sale. Outside a namespace's
// deletion the sale waits for its Redis however long; in one, it waits a
// minute after its deletion began, then goes without its cleanup.
func TestNamespaceDeletionGivesUpOnItsStoresAfterAMinute(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	late := e.lateClock()
	e.startController()
	fs := e.openSale("instore", 10)
	ctx := context.Background()
	e.deleteObjects(e.saleSecrets()...)
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	present := func() bool {
		return k8s.Get(ctx, client.ObjectKeyFromObject(fs), &flashsalev1alpha1.FlashSale{}) == nil
	}
	late.Store(true) // 2 h after the deletion
	e.deleteObjects(fs)
	if !hasEvent(t, e.ns, "instore", controllers.ReasonCleanupFailed) {
		t.Fatal("no CleanupFailed while the deletion waits for Redis")
	}
	if !present() {
		t.Fatal("a sale whose namespace is not being deleted went without its cleanup")
	}

	late.Store(false)
	e.deleteNamespace()
	time.Sleep(11 * time.Second) // at least one retry: they back off to 10 s
	if !present() {
		t.Fatal("the sale went without its cleanup within a minute of its deletion")
	}
	late.Store(true)
	e.waitGone("instore", settle)
}
