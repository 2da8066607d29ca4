package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

func TestDeleteCleansRedisKeepsLedger(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("doomed", 30)
	if len(fs.Finalizers) == 0 {
		t.Fatal("no finalizer")
	}
	eng := e.engineFor(fs, sharedRedis.Addr())
	ids := []string{e.reserve(eng, "a").ID, e.reserve(eng, "b").ID}
	ctx := context.Background()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(settle)
	for {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "doomed"}, &flashsalev1alpha1.FlashSale{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("FlashSale not gone: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	states, err := eng.Gates().ShardStates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Present {
			t.Fatalf("shard %d still in Redis", s.Index)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr()})
	defer rdb.Close()
	if n, _ := stock.New(rdb, string(fs.UID), int(ptr.Deref(fs.Spec.Shards, 10))).DeleteAll(ctx); n != 0 {
		t.Fatalf("%d Redis keys left", n)
	}
	l, err := ledger.Open(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, id := range ids {
		if o, err := l.GetOrder(ctx, string(fs.UID), id); err != nil || o.Status != ledger.StatusPending {
			t.Fatalf("ledger row %s: %+v %v", id, o, err)
		}
	}
	c, err := l.GetCampaign(ctx, string(fs.UID))
	if err != nil || c.DeletedAt == nil {
		t.Fatalf("ledger campaign %+v %v", c, err)
	}
	var d appsv1.Deployment
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "doomed-reserve"}, &d); !apierrors.IsNotFound(err) && d.DeletionTimestamp.IsZero() {
		t.Fatalf("reserve Deployment still there: %v", err)
	}
	var pdb policyv1.PodDisruptionBudget
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "doomed-reserve"}, &pdb); !apierrors.IsNotFound(err) && pdb.DeletionTimestamp.IsZero() {
		t.Fatalf("reserve PodDisruptionBudget still there: %v", err)
	}
	var idSecret corev1.Secret
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "doomed-ids"}, &idSecret); !apierrors.IsNotFound(err) && idSecret.DeletionTimestamp.IsZero() {
		t.Fatalf("id key Secret still there: %v", err)
	}
}

// A deletion that waits for Redis says so in an event, and completes once
// Redis is back.
func TestDeletionWaitingForRedisSaysWhy(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("stuck", 10)
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	if !hasEvent(t, e.ns, "stuck", controllers.ReasonCleanupFailed) {
		t.Fatal("no event while the deletion waits for Redis")
	}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "stuck"}, &flashsalev1alpha1.FlashSale{}); err != nil {
		t.Fatalf("deleted without its cleanup: %v", err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitGone("stuck", 30*time.Second)
}

// A sale deleted with its Secrets (a namespace deleted, a GitOps prune) is
// cleaned up with the connections the operator opened before; after an
// operator restart there are none, and the cleanup is skipped, saying so.
func TestDeletionWithItsSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	pruned := e.openSale("pruned", 10)
	orphaned := e.openSale("orphaned", 10)
	ctx := context.Background()
	cleaned := func(fs *flashsalev1alpha1.FlashSale) bool { return cleanedUp(t, e, sharedRedis.Addr(), fs) }
	for _, name := range []string{"shop-redis", "shop-ledger", "waiting-room"} {
		if err := k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := k8s.Delete(ctx, pruned); err != nil {
		t.Fatal(err)
	}
	e.waitGone("pruned", settle)
	if !cleaned(pruned) {
		t.Fatal("a sale deleted with its Secrets kept its Redis keys or ledger campaign")
	}
	// A reconcile queued by the children's deletion can read the sale from
	// a cache that still holds it with its finalizer.
	old := pruned.DeepCopy()
	old.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	old.Finalizers = []string{controllers.Finalizer}
	e.stale.Store(old)
	if _, err := e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pruned)}); err != nil {
		t.Fatalf("reconcile of a sale the cache still holds: %v", err)
	}
	e.stale.Store(nil)
	if hasEvent(t, e.ns, "pruned", controllers.ReasonCleanupSkipped) {
		t.Fatal("CleanupSkipped for a sale that was cleaned up")
	}

	stop()
	e.startController()
	if err := k8s.Delete(ctx, orphaned); err != nil {
		t.Fatal(err)
	}
	e.waitGone("orphaned", settle)
	if !hasEvent(t, e.ns, "orphaned", controllers.ReasonCleanupSkipped) {
		t.Fatal("no CleanupSkipped event")
	}
	if cleaned(orphaned) {
		t.Fatal("cleaned up without connections")
	}
}

// cleanedUp tells whether a deleted sale's Redis keys are gone and its ledger
// campaign is marked deleted.
func cleanedUp(t *testing.T, e *env, redisAddr string, fs *flashsalev1alpha1.FlashSale) bool {
	t.Helper()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	states, err := stock.New(rdb, string(fs.UID), 4).State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := l.GetCampaign(ctx, string(fs.UID))
	if err != nil {
		t.Fatal(err)
	}
	return !slices.ContainsFunc(states, func(st stock.ShardState) bool { return st.Present }) && c.DeletedAt != nil
}

// A sale whose admission Secret is gone (a rotation by delete and create, a
// prune of that one Secret) is still cleaned up after an operator restart:
// the admission key only lets the pods reserve, and the Redis and ledger
// Secrets are all the cleanup needs.
func TestDeletionWithoutItsAdmissionSecret(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	fs := e.openSale("keyless", 10)
	stop()
	ctx := context.Background()
	if err := k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "waiting-room", Namespace: e.ns}}); err != nil {
		t.Fatal(err)
	}
	e.startController()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	e.waitGone("keyless", settle)
	if hasEvent(t, e.ns, "keyless", controllers.ReasonCleanupSkipped) {
		t.Fatal("CleanupSkipped for a sale whose Redis and ledger Secrets are there")
	}
	if !cleanedUp(t, e, sharedRedis.Addr(), fs) {
		t.Fatal("a sale deleted without its admission Secret kept its Redis keys or ledger campaign")
	}
}

// A deletion while the ledger is down closes the sale and waits: the Redis
// keys stay (every retry would scan a shared keyspace again) until the
// campaign can be marked deleted.
func TestDeletionWaitsForTheLedger(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	e.startController()
	fs := e.openSale("waiting", 10)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	store := stock.New(rdb, string(fs.UID), 4)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	if !hasEvent(t, e.ns, "waiting", controllers.ReasonCleanupFailed) {
		t.Fatal("no event while the deletion waits for the ledger")
	}
	// Ready says it too: the rest of the status is the live sale's.
	e.waitFor("waiting", settle, "Ready False, Deleting", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonDeleting))
	time.Sleep(2 * time.Second) // retries
	states, err := store.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range states {
		if !st.Present || st.State != stock.StateEnded {
			t.Fatalf("shard %d while the deletion waits for the ledger: present %v, %s", st.Index, st.Present, st.State)
		}
	}
	// The phase and Admitting say so too, not what the live sale did.
	e.waitFor("waiting", settle, "Ended, not admitting", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionAdmitting)
		return fs.Status.Phase == flashsalev1alpha1.PhaseEnded && c != nil && c.Status == metav1.ConditionFalse && c.Reason == controllers.ReasonEnded
	})
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitGone("waiting", 30*time.Second)
	if n, err := store.DeleteAll(ctx); err != nil || n != 0 {
		t.Fatalf("%d Redis keys left (%v)", n, err)
	}
}

// The same after an operator restart, with no connection of its own: the
// sale is ended through Redis alone while the deletion waits.
func TestDeletionAfterARestartWithTheLedgerDown(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	stop := e.startController()
	fs := e.openSale("restarted", 10)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	store := stock.New(rdb, string(fs.UID), 4)
	stop()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	e.startController()
	ctx := context.Background()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, settle, "every shard ENDED, kept", func() bool {
		states, err := store.State(ctx)
		return err == nil && !slices.ContainsFunc(states, func(st stock.ShardState) bool { return !st.Present || st.State != stock.StateEnded })
	})
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitGone("restarted", 30*time.Second)
	if n, err := store.DeleteAll(ctx); err != nil || n != 0 {
		t.Fatalf("%d Redis keys left (%v)", n, err)
	}
}

// A sale deleted after its Redis or ledger Secret was changed to values that
// do not connect: the pods go on selling with the values they started with,
// so the deletion ends the sale and cleans it up with the connections the
// operator opened before, as the reconcile goes on using them.
func TestDeletionAfterSecretsThatDoNotConnect(t *testing.T) {
	t.Parallel()
	dead := func() string {
		port, err := testharness.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("127.0.0.1:%d", port)
	}
	for _, c := range []struct{ sale, secret, key, value, reason string }{
		{"rotated-redis", "shop-redis", "addresses", dead(), controllers.ReasonRedisUnreachable},
		{"rotated-ledger", "shop-ledger", "dsn", "postgres://flashsale@" + dead() + "/flashsale?sslmode=disable&connect_timeout=2", controllers.ReasonLedgerUnreachable},
	} {
		t.Run(c.secret, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, sharedRedis.Addr(), sharedPG)
			e.startController()
			fs := e.openSale(c.sale, 10)
			e.setSecret(c.secret, c.key, c.value)
			e.waitFor(c.sale, settle, c.reason, reasonIs(flashsalev1alpha1.ConditionReady, c.reason))
			if err := k8s.Delete(context.Background(), fs); err != nil {
				t.Fatal(err)
			}
			e.waitGone(c.sale, settle)
			if !cleanedUp(t, e, sharedRedis.Addr(), fs) {
				t.Fatal("the deleted sale kept its Redis keys or ledger campaign")
			}
		})
	}
}
