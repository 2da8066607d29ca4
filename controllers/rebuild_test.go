package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

func TestRedisLostFailsClosedAndRebuilds(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("lossy", 200)
	eng := e.engineFor(fs, r.Addr())
	ctx := context.Background()
	var pending []string
	for i := range 20 {
		res := e.reserve(eng, fmt.Sprintf("v-%d", i))
		if i < 8 {
			if _, err := eng.Checkout(ctx, fmt.Sprintf("v-%d", i), res.ID, "pay"); err != nil {
				t.Fatal(err)
			}
		} else {
			pending = append(pending, res.ID)
		}
	}
	e.waitFor("lossy", settle, "counts", func(fs *flashsalev1alpha1.FlashSale) bool { return fs.Status.Sold == 8 && fs.Status.Reserved == 12 })

	// Watch the phase as it changes: FailClosed must show within 5 s of the loss.
	w, err := k8s.Watch(ctx, &flashsalev1alpha1.FlashSaleList{}, client.InNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	// The loss can be seen once Redis answers again; a reconcile that found
	// it down in between retries within retryUnhealthy (3 s).
	lost := time.Now()
	var sawFailClosed time.Duration
	deadline := time.After(settle)
	for sawFailClosed == 0 {
		select {
		case ev := <-w.ResultChan():
			if got, ok := ev.Object.(*flashsalev1alpha1.FlashSale); ok && got.Status.Phase == flashsalev1alpha1.PhaseFailClosed {
				sawFailClosed = time.Since(lost)
				c := meta.FindStatusCondition(got.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy)
				if c == nil || c.Reason != controllers.ReasonRedisDataLost || !strings.Contains(c.Message, "rebuilt from the ledger") {
					t.Fatalf("RedisHealthy condition %+v", c)
				}
			}
		case <-deadline:
			t.Fatal("never saw FailClosed")
		}
	}
	t.Logf("FailClosed visible %s after the loss", sawFailClosed)
	if sawFailClosed > 5*time.Second {
		t.Fatalf("FailClosed showed %s after the loss", sawFailClosed)
	}
	fs = e.waitFor("lossy", settle, "Open after rebuild", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil
	})
	if fs.Status.Epoch != 2 || fs.Status.Available != 180 || fs.Status.Reserved != 12 || fs.Status.Sold != 8 {
		t.Fatalf("counts after rebuild %+v", fs.Status)
	}
	lr := fs.Status.LastRebuild
	if lr.Sold != 8 || lr.Reserved != 12 || lr.Available != 180 || lr.Reason == "" {
		t.Fatalf("lastRebuild %+v", lr)
	}
	if !hasEvent(t, e.ns, "lossy", controllers.ReasonRedisDataLost) || !hasEvent(t, e.ns, "lossy", controllers.ReasonRebuilt) {
		t.Fatal("missing loss/rebuild events")
	}
	// Reservations acknowledged before the loss still check out.
	for i, id := range pending {
		co, err := eng.Checkout(ctx, fmt.Sprintf("v-%d", i+8), id, "pay")
		if err != nil || co.Outcome != ledger.CheckoutCommitted {
			t.Fatalf("checkout after rebuild: %v %v", co.Outcome, err)
		}
	}
	e.waitFor("lossy", settle, "all sold", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Sold == 20 && fs.Status.Reserved == 0 && fs.Status.Available == 180
	})
	if fs.Generation != 1 {
		t.Fatalf("the controller changed the spec: generation %d", fs.Generation)
	}
}

// A reconcile that rebuilds the stock but read a stale status cannot write
// that status (the write is refused as a conflict, and so are those of the
// reconciles that read the same copy). It can no longer matter: the
// rebuild's record and the servers it rebuilt on are in the ledger, so the
// stale copies do not rebuild again, an operator restarted meanwhile does
// not take the rebuilt server for one restarted since, and the next status
// written reports the rebuild.
func TestRebuildRecordOutlivesAStaleRead(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	e.statusRefresh = time.Minute // only the reconciles below run, once the creation's are over
	stop := e.startController()
	e.openSale("stale-rebuild", 10)
	fs := e.settled("stale-rebuild")
	// The stored sale moves on, and the copy read is older, with another
	// status: the sale failed closed, as the reconcile that found the loss
	// wrote it.
	e.holdFinalizer("stale-rebuild")
	old := fs.DeepCopy()
	old.Status.Phase = flashsalev1alpha1.PhaseFailClosed
	old.Status.Reserved++
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, runID, _ := strings.Cut(info, "run_id:")
	runID, _, _ = strings.Cut(runID, "\r\n")
	if st := e.get("stale-rebuild").Status; st.LastRebuild != nil || len(st.RedisServers) != 1 || st.RedisServers[0].RunID == runID {
		t.Fatalf("before the reconciles below: lastRebuild %+v, redisServers %+v", st.LastRebuild, st.RedisServers)
	}
	e.stale.Store(old)
	// Rebuilt off the first, and reported by the first to find it over (its
	// Rebuilt event is sent before the manager stops below); every status
	// write is refused as stale.
	for n := 0; n < 3 || countEvents(t, e.ns, "stale-rebuild", controllers.ReasonRebuilt) == 0; n++ {
		res, err := e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(fs)})
		if err != nil || res.RequeueAfter <= 0 {
			t.Fatalf("reconcile from a stale copy: %+v %v", res, err)
		}
		if n > 200 {
			t.Fatal("no reconcile from a stale copy reported the rebuild")
		}
		time.Sleep(min(res.RequeueAfter, 100*time.Millisecond))
	}
	if st := e.get("stale-rebuild").Status; st.LastRebuild != nil || st.Reserved == old.Status.Reserved {
		t.Fatalf("the stale status was written: %+v", st)
	}
	// The operator restarts: its connections, and their memory of the
	// servers, go with it.
	stop()
	e.stale.Store(nil)
	e.startController()
	live := e.waitFor("stale-rebuild", settle, "the rebuild reported", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.LastRebuild != nil
	})
	if len(live.Status.RedisServers) != 1 || live.Status.RedisServers[0].RunID != runID {
		t.Fatalf("redisServers %+v, want the restarted server's run id %s", live.Status.RedisServers, runID)
	}
	if live.Status.Phase != flashsalev1alpha1.PhaseOpen || live.Status.LastRebuild.Available != 10 {
		t.Fatalf("phase %s, lastRebuild %+v", live.Status.Phase, live.Status.LastRebuild)
	}
	if !hasEvent(t, e.ns, "stale-rebuild", controllers.ReasonRebuilt) {
		t.Fatal("no Rebuilt event")
	}
	if n := countEvents(t, e.ns, "stale-rebuild", controllers.ReasonRebuilt); n != 1 {
		t.Fatalf("%d Rebuilt events for one rebuild", n)
	}
}

// A rebuild that runs across the schedule's end opens the shards ended, and
// the status of that reconcile says so: the shards open in the state of the
// moment they open, not of the moment the reconcile began. Here the rebuild
// waits on the campaign row, held by the test, while the clock passes the end.
func TestRebuildAcrossTheScheduleEnd(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	late := e.lateClock()
	e.startController()
	e.apply(e.sale("edge", 50).schedule(time.Time{}, time.Now().Add(time.Hour)))
	fs := e.waitFor("edge", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	eng := e.engineFor(fs, r.Addr())
	e.reserve(eng, "early")

	ctx := context.Background()
	release := e.holdLedger("SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE", string(fs.UID))
	w, err := k8s.Watch(ctx, &flashsalev1alpha1.FlashSaleList{}, client.InNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	e.waitForLockWaiter("the rebuild waiting for the campaign row")
	late.Store(true)
	release()
	deadline := time.After(settle)
	for {
		select {
		case ev := <-w.ResultChan():
			got, ok := ev.Object.(*flashsalev1alpha1.FlashSale)
			if !ok || got.Status.LastRebuild == nil {
				continue
			}
			if got.Status.Phase != flashsalev1alpha1.PhaseEnded {
				t.Fatalf("the rebuilt sale is %s, not Ended, past its end", got.Status.Phase)
			}
			states, err := eng.Gates().ShardStates(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range states {
				if s.State != stock.StateEnded {
					t.Fatalf("shard %d is %s after a rebuild past the end", s.Index, s.State)
				}
			}
			return
		case <-deadline:
			t.Fatal("no status with the rebuild")
		}
	}
}

// Redis restarts from an older snapshot while the operator is down too: the
// restarted operator knows the old run id from the status, fails closed and
// rebuilds, so reservations missing from the snapshot are not sold twice. The
// shards' metas record no server here (as if seeded by an older version), so
// the status is all that tells.
func TestRedisRestartedWhileOperatorDown(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	stop := e.startController()
	e.apply(e.sale("snapshot", 100))
	fs := e.waitFor("snapshot", settle, "Open, run id recorded", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && len(fs.Status.RedisServers) == 1
	})
	oldRunID := fs.Status.RedisServers[0].RunID
	if fs.Status.RedisServers[0].Address != r.Addr() || len(oldRunID) != 40 {
		t.Fatalf("redisServers %+v", fs.Status.RedisServers)
	}
	// A shard seeded before metas recorded their server is stamped by the
	// controller once it has checked the server.
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	metaKey := stock.ShardKeys(string(fs.UID), 0).Meta()
	if err := rdb.HDel(context.Background(), metaKey, "srv").Err(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("snapshot", settle, "shard 0 stamped again", func(*flashsalev1alpha1.FlashSale) bool {
		return rdb.HGet(context.Background(), metaKey, "srv").Val() == oldRunID
	})
	eng := e.engineFor(fs, r.Addr())
	for i := range 5 {
		e.reserve(eng, fmt.Sprintf("before-%d", i))
	}
	stop()

	for i := range 4 {
		if err := rdb.HDel(context.Background(), stock.ShardKeys(string(fs.UID), i).Meta(), "srv").Err(); err != nil {
			t.Fatal(err)
		}
	}
	// A snapshot, five more acknowledged reservations, then a crash: the
	// restarted server has the snapshot's stock, the ledger all ten.
	if err := rdb.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		e.reserve(eng, fmt.Sprintf("after-%d", i))
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	n, err := eng.Counts(context.Background())
	if err != nil || n.Available != 95 {
		t.Fatalf("the snapshot's stock: %+v %v", n, err)
	}

	e.startController()
	fs = e.waitFor("snapshot", settle, "rebuilt and Open", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil
	})
	if !strings.Contains(fs.Status.LastRebuild.Reason, "restarted") || fs.Status.LastRebuild.Reserved != 10 {
		t.Fatalf("lastRebuild %+v", fs.Status.LastRebuild)
	}
	fs = e.waitFor("snapshot", settle, "counts from the ledger", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Available == 90 && fs.Status.Reserved == 10
	})
	if len(fs.Status.RedisServers) != 1 || fs.Status.RedisServers[0].RunID == oldRunID || fs.Status.Epoch != 2 {
		t.Fatalf("after the rebuild: epoch %d, redisServers %+v", fs.Status.Epoch, fs.Status.RedisServers)
	}
	if !hasEvent(t, e.ns, "snapshot", controllers.ReasonRedisDataLost) {
		t.Fatal("no RedisDataLost event")
	}
	// A reconcile that reads the status from before the rebuild was written
	// (a cache that has not caught up) does not rebuild a second time.
	before := fs.DeepCopy()
	fs.Status.Phase = flashsalev1alpha1.PhaseFailClosed
	if err := k8s.Status().Patch(context.Background(), fs, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	fs = e.waitFor("snapshot", settle, "Open again", phaseIs(flashsalev1alpha1.PhaseOpen))
	if fs.Status.Epoch != 2 {
		t.Fatalf("rebuilt again on a stale phase: epoch %d", fs.Status.Epoch)
	}
}

// A first seeding cut short (the operator restarted between the ledger's
// campaign and the last shard, or Redis refused a script until its ACL was
// fixed) is completed from the ledger, and reported as a seeding, not as
// Redis data loss: a sale that never opened does not fail closed.
func TestFirstSeedingCutShortIsCompleted(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	fs := e.apply(e.sale("half", 10))
	ctx := context.Background()
	l, err := ledger.Open(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, _, err := l.EnsureCampaign(ctx, ledger.Campaign{ID: string(fs.UID), Namespace: e.ns, Name: fs.Name, SKU: fs.Spec.SKU, Allocation: 10, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	if _, err := stock.New(rdb, string(fs.UID), 4).Seed(ctx, 0, c.ShardAllocations[0], c.Epoch, stock.StateOpen, c.LastChangeID); err != nil {
		t.Fatal(err)
	}
	e.startController()
	fs = e.waitFor("half", settle, "Open, seeded", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue)
	})
	if fs.Status.Available != 10 || fs.Status.LastRebuild != nil {
		t.Fatalf("status after a first seeding completed: available %d, lastRebuild %+v", fs.Status.Available, fs.Status.LastRebuild)
	}
	if !hasEvent(t, e.ns, "half", controllers.ReasonSeeded) {
		t.Fatal("no Seeded event")
	}
	if n := countEvents(t, e.ns, "half", controllers.ReasonRedisDataLost); n != 0 {
		t.Fatalf("%d RedisDataLost events for a sale that never opened", n)
	}
}

// A Redis that may evict keys: a new sale is not seeded on it, and a live
// sale whose server starts evicting is reported (RedisHealthy False, Ready
// False, one Warning) while it goes on being gated: pausing it still closes it.
// The new sale has its one Warning too.
func TestRedisThatMayEvict(t *testing.T) {
	t.Parallel()
	srv, err := testharness.StartRedisArgs("--maxmemory", "100mb", "--maxmemory-policy", "noeviction")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	e := newEnv(t, srv.Addr(), sharedPG)
	e.startController()
	e.openSale("live", 10)

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("live", settle, "RedisEvictionPolicy", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonRedisEvictionPolicy))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy); c == nil || c.Reason != controllers.ReasonEvictionPolicy ||
		!strings.Contains(c.Message, "allkeys-lru") {
		t.Fatalf("RedisHealthy %+v", c)
	}
	if fs.Status.Phase != flashsalev1alpha1.PhaseOpen {
		t.Fatalf("phase %s: the live sale was closed", fs.Status.Phase)
	}
	updateSpec(t, e.ns, "live", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	e.waitFor("live", settle, "Paused", phaseIs(flashsalev1alpha1.PhasePaused))

	e.apply(e.sale("new", 10))
	fs = e.waitFor("new", settle, "RedisEvictionPolicy", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonRedisEvictionPolicy))
	if conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue) {
		t.Fatal("a sale seeded on a Redis that may evict its keys")
	}
	time.Sleep(2 * time.Second)
	// One each: the live sale's when its server began to evict, the new
	// one's when it was refused seeding.
	live, fresh := countSent(t, e.ns, "live", controllers.ReasonRedisEvictionPolicy), countSent(t, e.ns, "new", controllers.ReasonRedisEvictionPolicy)
	if live != 1 || fresh != 1 {
		t.Fatalf("RedisEvictionPolicy warnings: %d for the live sale, %d for the new one; want one each", live, fresh)
	}
}
