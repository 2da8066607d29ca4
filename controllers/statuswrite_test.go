package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// status.countsObservedAt says how old the counts are: renewed while Redis
// and the ledger can be read, even when nothing changes, and left as it was
// when they cannot, so stale counts show as such.
func TestCountsSayHowOldTheyAre(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	e.countsStamp = time.Second
	e.startController()
	first := e.openSale("counted", 10).Status.CountsObservedAt
	if first == nil {
		t.Fatal("no countsObservedAt")
	}
	e.waitFor("counted", settle, "countsObservedAt renewed", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.CountsObservedAt.After(first.Time)
	})
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("counted", settle, "RedisHealthy False", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse)
	})
	last := fs.Status.CountsObservedAt
	time.Sleep(3 * time.Second)
	if at := e.get("counted").Status.CountsObservedAt; !at.Equal(last) {
		t.Fatalf("countsObservedAt moved from %s to %s while Redis was down", last, at)
	}
	out := kubectl(t, "get", "fs", "counted", "-n", e.ns, "-o", "wide")
	if !strings.Contains(out, "COUNTED") {
		t.Fatalf("kubectl get fs -o wide has no COUNTED column:\n%s", out)
	}
}

// A reconcile that reads the sale from a cache behind its last status write
// does not write over it: its conditions and events would come from the
// older status (here Redis unreachable an hour ago, which would be written
// as recovered just now). What it did is still said: here it paused the
// sale, as the older spec asked.
func TestStatusFromAStaleCacheIsNotWritten(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("behind", 10)
	old := e.get("behind")
	old.Spec.Paused = true
	hourAgo := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	meta.SetStatusCondition(&old.Status.Conditions, metav1.Condition{Type: flashsalev1alpha1.ConditionRedisHealthy,
		Status: metav1.ConditionFalse, Reason: controllers.ReasonUnreachable, Message: "no answer", LastTransitionTime: hourAgo})
	// A newer version of the sale exists.
	update(t, e.get("behind"), func(fs *flashsalev1alpha1.FlashSale) { fs.Annotations = map[string]string{"note": "newer"} })
	healthy := func() metav1.Time {
		t.Helper()
		c := meta.FindStatusCondition(e.get("behind").Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy)
		if c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("RedisHealthy %+v", c)
		}
		return c.LastTransitionTime
	}
	since := healthy()
	time.Sleep(time.Until(since.Add(1100 * time.Millisecond))) // a rewrite would show in the stored second
	e.stale.Store(old)
	res, err := e.reconciler.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(old)})
	e.stale.Store(nil)
	if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter >= time.Second {
		t.Fatalf("reconcile from a stale copy: %+v %v, want a retry soon and no error", res, err)
	}
	if now := healthy(); !now.Equal(&since) {
		t.Fatalf("RedisHealthy rewritten from a stale copy: True since %s, was since %s", now, since)
	}
	if !hasEventSaying(t, e.ns, "behind", controllers.ReasonGateChanged, stock.StatePaused) {
		t.Fatal("no GateChanged event for the pause the stale reconcile wrote")
	}
	if hasEvent(t, e.ns, "behind", controllers.ReasonRedisRecovered) {
		t.Fatal("RedisRecovered emitted from a stale copy")
	}
	// The sale as stored is not paused: the next reconcile opens it again.
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr()})
	defer rdb.Close()
	store := stock.New(rdb, string(old.UID), int(ptr.Deref(old.Spec.Shards, 10)))
	testharness.Eventually(t, settle, "every shard open again", func() bool {
		states, err := store.State(context.Background())
		return err == nil && !slices.ContainsFunc(states, func(st stock.ShardState) bool { return st.State != stock.StateOpen })
	})
}

// A change made while a reconcile runs, even one that leaves the status as it
// was (here another tool's finalizer), is a conflict for that reconcile's
// status write: it is not merged into the newer version but requeued soon,
// and the next reconcile computes the same status from Redis and the ledger
// (new counts here) and writes it.
func TestAConflictIsRequeuedAndTheNextReconcileWritesTheStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.countsStamp = 100 * time.Millisecond // every reconcile writes the status
	e.statusRefresh = time.Minute          // and none runs unless asked
	e.startController()
	e.openSale("edited", 10)
	read := e.settled("edited")
	e.holdFinalizer("edited")
	if now := e.get("edited"); !equality.Semantic.DeepEqual(now.Status, read.Status) || now.ResourceVersion == read.ResourceVersion {
		t.Fatal("the status changed, or the finalizer did not: the test needs the status as it was read")
	}
	time.Sleep(time.Until(read.Status.CountsObservedAt.Add(1100 * time.Millisecond))) // a new stamp shows in the stored second
	key := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(read)}
	e.stale.Store(read)
	res, err := e.reconciler.Reconcile(context.Background(), key)
	e.stale.Store(nil)
	if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter >= time.Second {
		t.Fatalf("reconcile over a newer version: %+v %v, want a retry soon and no error", res, err)
	}
	if got := e.get("edited").Status; !equality.Semantic.DeepEqual(got, read.Status) {
		t.Fatalf("the status was written over a newer version: countsObservedAt %s, read as %s", got.CountsObservedAt, read.Status.CountsObservedAt)
	}
	if _, err := e.reconciler.Reconcile(context.Background(), key); err != nil {
		t.Fatalf("the requeued reconcile: %v", err)
	}
	got := e.get("edited").Status
	if !got.CountsObservedAt.After(read.Status.CountsObservedAt.Time) {
		t.Fatalf("countsObservedAt %s, read as %s: the requeued reconcile did not write the status", got.CountsObservedAt, read.Status.CountsObservedAt)
	}
	// Nothing else moved: the same world gives the same status.
	got.CountsObservedAt = read.Status.CountsObservedAt
	if !equality.Semantic.DeepEqual(got, read.Status) {
		t.Fatalf("the requeued reconcile wrote another status:\n got %+v\nread %+v", got, read.Status)
	}
}

// While reservations move the counts, the status is written about once per
// refresh (1 s here), not once per reconcile that each write would start.
func TestStatusWritesFollowTheRefresh(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("busy", 1000)
	eng := e.engineFor(fs, sharedRedis.Addr())
	ctx := context.Background()
	w, err := k8s.Watch(ctx, &flashsalev1alpha1.FlashSaleList{}, client.InNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var writes atomic.Int64
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				writes.Add(1)
			}
		}
	}()
	const load = 6 * time.Second
	stop := time.Now().Add(load)
	reserved := 0
	for ; time.Now().Before(stop); reserved++ {
		e.reserve(eng, fmt.Sprintf("buyer-%d", reserved))
		time.Sleep(20 * time.Millisecond)
	}
	// One write per refresh, and a few for the Deployments' own changes.
	t.Logf("%d status writes", writes.Load())
	if n := writes.Load(); n > 15 {
		t.Fatalf("%d status writes in %s of reservations", n, load)
	}
	e.waitFor("busy", settle, "the counts", func(fs *flashsalev1alpha1.FlashSale) bool { return fs.Status.Reserved == int64(reserved) })
}

// Ready is decided once per reconcile: a problem that does not stop the
// phases (here a Secret deleted mid-sale) keeps Ready False with a steady
// lastTransitionTime, instead of a True then False on every status refresh.
func TestReadyDoesNotFlapWhileNotReady(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.apply(e.sale("steady", 10))
	markReady(t, e.ns, "steady-reserve")
	markReady(t, e.ns, "steady-sweeper")
	e.waitFor("steady", settle, "Ready", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue)
	})
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "waiting-room", Namespace: e.ns}}
	if err := k8s.Delete(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("steady", settle, "SecretNotFound", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonSecretNotFound))
	since := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady).LastTransitionTime
	time.Sleep(3500 * time.Millisecond) // three status refreshes, in other seconds
	c := meta.FindStatusCondition(e.get("steady").Status.Conditions, flashsalev1alpha1.ConditionReady)
	if c.Status != metav1.ConditionFalse || !c.LastTransitionTime.Equal(&since) {
		t.Fatalf("Ready %s since %s, want False since %s", c.Status, c.LastTransitionTime, since)
	}
}

// Status writes that conflict again and again (another writer in a hot loop)
// are retried later each time, per sale: 100 ms, then doubled with each
// conflict in a row; a status written resets the wait.
func TestRepeatedConflictsBackOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.countsStamp = 100 * time.Millisecond // every reconcile writes the status
	e.statusRefresh = time.Minute          // and none runs unless asked
	e.startController()
	e.openSale("hot", 10)
	read := e.settled("hot")
	e.holdFinalizer("hot") // a newer version: every write from read conflicts
	key := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(read)}
	conflicts := func(n int) []time.Duration {
		t.Helper()
		var out []time.Duration
		for range n {
			// A new stamp shows in the stored second: each write is tried.
			time.Sleep(time.Until(read.Status.CountsObservedAt.Add(1100 * time.Millisecond)))
			e.stale.Store(read)
			res, err := e.reconciler.Reconcile(context.Background(), key)
			e.stale.Store(nil)
			if err != nil {
				t.Fatalf("reconcile over a newer version: %v", err)
			}
			out = append(out, res.RequeueAfter)
		}
		return out
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}
	if got := conflicts(4); !slices.Equal(got, want) {
		t.Fatalf("retries after conflicts in a row: %v, want %v", got, want)
	}
	// Another sale's conflicts have their own backoff.
	e.openSale("other", 10)
	other := e.settled("other")
	e.holdFinalizer("other")
	time.Sleep(time.Until(other.Status.CountsObservedAt.Add(1100 * time.Millisecond)))
	e.stale.Store(other)
	res, err := e.reconciler.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(other)})
	e.stale.Store(nil)
	if err != nil || res.RequeueAfter != want[0] {
		t.Fatalf("another sale's first conflict: %+v %v, want a retry after %s", res, err, want[0])
	}
	// A reconcile that writes the status resets the backoff (once the cache
	// holds the newer version, or it would conflict too).
	testharness.Eventually(t, settle, "the cache holds the newer version", func() bool {
		var cached flashsalev1alpha1.FlashSale
		return e.mgr.GetClient().Get(context.Background(), key.NamespacedName, &cached) == nil && cached.ResourceVersion == e.get("hot").ResourceVersion
	})
	if res, err := e.reconciler.Reconcile(context.Background(), key); err != nil || res.RequeueAfter == want[0] {
		t.Fatalf("reconcile from the newer version: %+v %v", res, err)
	}
	read = e.get("hot")
	// Newer again, by a change that queues no reconcile of its own.
	update(t, e.get("hot"), func(fs *flashsalev1alpha1.FlashSale) { fs.Finalizers = append(fs.Finalizers, "example.com/second") })
	t.Cleanup(func() {
		update(t, e.get("hot"), func(fs *flashsalev1alpha1.FlashSale) {
			fs.Finalizers = slices.DeleteFunc(fs.Finalizers, func(f string) bool { return f == "example.com/second" })
		})
	})
	if got := conflicts(2); !slices.Equal(got, want[:2]) {
		t.Fatalf("retries after a status written: %v, want %v", got, want[:2])
	}
}
