package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A rebuild of more orders than one ledger batch and one script call, with
// stolen reservations and paid ones, puts back exactly what the ledger holds:
// the stock, the pending reservations (checkout-able, stolen ones with their
// pointers), and every buyer's units against the per-user limit, committed
// ones included although their hashes are not recreated.
func TestRebuildStreamsManyBatches(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const shards, perShard = 3, 450
		f := newFixture(t, rdb, withAllocation(shards*perShard), withShards(shards), withSteal(2), withMaxPerUser(1))
		ctx := context.Background()
		filled := f.sellOutShard(0)
		type held struct {
			user string
			r    engine.Reservation
		}
		var all []held
		stolen := 0
		for i := 0; len(all) < 1150-filled; i++ {
			u := fmt.Sprintf("buyer-%d", i)
			r := f.reserve(u, "r", 1)
			if r.Outcome != engine.OutcomeReserved {
				t.Fatalf("reserve %s: %s", u, r.Outcome)
			}
			if r.Reservation.Shard != stock.HomeShard(u, shards) {
				stolen++
			}
			all = append(all, held{u, r.Reservation})
		}
		if stolen < 100 {
			t.Fatalf("only %d stolen reservations: the test does not exercise pointers", stolen)
		}
		paid := map[string]bool{}
		for i, h := range all {
			if i%3 != 0 {
				continue
			}
			if co, err := f.e.Checkout(ctx, h.user, h.r.ID, "pay-"+h.user); err != nil || co.Outcome != ledger.CheckoutCommitted {
				t.Fatalf("checkout %s: %+v %v", h.r.ID, co, err)
			}
			paid[h.r.ID] = true
		}
		before := f.assertConserved()

		if _, err := f.e.Store().DeleteAll(ctx); err != nil {
			t.Fatal(err)
		}
		rep, err := f.e.Rebuild(ctx, openGate)
		if err != nil {
			t.Fatal(err)
		}
		pending := int64(filled + len(all) - len(paid))
		if rep.Restored != pending || rep.Holders != int64(filled+len(all)) || rep.Sold != int64(len(paid)) || rep.Reserved != pending {
			t.Fatalf("report %+v: want %d restored and reserved, %d buyers, %d sold", rep, pending, filled+len(all), len(paid))
		}
		after := f.assertConserved()
		if after.Available != before.Available || after.Sold != before.Sold || after.Reserved != before.Reserved {
			t.Fatalf("counts after the rebuild %+v, before the loss %+v", after, before)
		}
		if held := f.redisHeld(); sum(held) != pending {
			t.Fatalf("Redis holds %v reserved units, the ledger %d", held, pending)
		}

		for i, h := range all {
			if i%7 != 0 {
				continue
			}
			// The limit counts what the buyer holds, paid or not.
			if r := f.reserve(h.user, "another", 1); r.Outcome != engine.OutcomeLimit {
				t.Fatalf("%s (paid %v) reserved again after the rebuild: %s", h.user, paid[h.r.ID], r.Outcome)
			}
			// The same request replays, paid or not, stolen or not.
			if r := f.reserve(h.user, "r", 1); r.Outcome != engine.OutcomeReplayed || r.Reservation.ID != h.r.ID {
				t.Fatalf("%s retried after the rebuild: %+v, want REPLAYED %s", h.user, r, h.r.ID)
			}
		}
		// A stolen pending reservation is checked out on its shard after the
		// rebuild, and a cancelled one gives its buyer's quota back at home.
		var checked, cancelled bool
		for _, h := range all {
			if paid[h.r.ID] || h.r.Shard == stock.HomeShard(h.user, shards) {
				continue
			}
			switch {
			case !checked:
				if co, err := f.e.Checkout(ctx, h.user, h.r.ID, "pay-late"); err != nil || co.Outcome != ledger.CheckoutCommitted {
					t.Fatalf("checkout of stolen %s after the rebuild: %+v %v", h.r.ID, co, err)
				}
				checked = true
			case !cancelled:
				if cr, err := f.e.Cancel(ctx, h.user, h.r.ID); err != nil || cr.Outcome != ledger.CancelCancelled {
					t.Fatalf("cancel of stolen %s after the rebuild: %+v %v", h.r.ID, cr, err)
				}
				if r := f.reserve(h.user, "again", 1); r.Outcome != engine.OutcomeReserved {
					t.Fatalf("%s after cancelling a stolen reservation: %s", h.user, r.Outcome)
				}
				cancelled = true
			}
		}
		if !checked || !cancelled {
			t.Fatal("no stolen pending reservation to check out and cancel")
		}
		f.assertConserved()
	})
}

func sum(xs []int64) (n int64) {
	for _, x := range xs {
		n += x
	}
	return n
}

// Failure matrix: a materialization racing a rebuild is counted or refused, never
// both, never neither. Reservations keep flowing while rebuilds run (without data
// loss, the worst case for fencing); at the end Redis and the ledger agree exactly.
func TestMaterializationRacingRebuild(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(3000), withShards(4), withMaxPerUser(1))
		ctx := context.Background()
		var wg sync.WaitGroup
		var refused, acked atomic.Int64
		var reservations []engine.Reservation
		wg.Add(1)
		go func() {
			defer wg.Done()
			reservations = storm(t, f, 2500, "racer", func(r engine.ReserveResult, err error) {
				switch {
				case errors.Is(err, engine.ErrUnavailable):
					refused.Add(1)
				case err != nil:
					t.Errorf("reserve: %v", err)
				case r.Outcome == engine.OutcomeReserved:
					acked.Add(1)
				}
			})
		}()
		for range 3 {
			time.Sleep(30 * time.Millisecond)
			if _, err := f.e.Rebuild(ctx, openGate); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()
		f.sweepUntilQuiet()
		c := f.assertConserved()
		if c.Pending != acked.Load() {
			t.Fatalf("ledger has %d pending units, %d were acknowledged", c.Pending, acked.Load())
		}
		f.assertLedgerHolds(reservations, nil)
		t.Logf("acknowledged %d, refused %d, epoch %d", acked.Load(), refused.Load(), c.Epoch)
	})
}

// A held reservation's hash outlives its reservation's whole lifetime (TTL
// and grace), beyond the default 24 h backstop too: it has no TTL, also once
// restored by a rebuild under a shorter reservation TTL. A hash that expired
// first would take its unit with it.
func TestLongReservationsOutliveTheBackstop(t *testing.T) {
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(10), withShards(1), withTTL(30*time.Hour, time.Hour))
	r := f.reserve("vera", "r", 1)
	if r.Outcome != engine.OutcomeReserved {
		t.Fatal(r.Outcome)
	}
	ttl, err := rdb.TTL(context.Background(), f.e.Store().Keys(0).Res(strings.TrimPrefix(r.Reservation.ID, "0."))).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl != -1 {
		t.Fatalf("reservation hash TTL %s, want none", ttl)
	}

	// The TTL is lowered, then Redis is rebuilt: the restored hash still
	// outlives the reservation's own expiry, 30 h away.
	cfg := f.cfg
	cfg.TTL = 10 * time.Minute
	e := openEngine(t, cfg, rdb, f.l)
	if _, err := e.Rebuild(context.Background(), openGate); err != nil {
		t.Fatal(err)
	}
	ttl, err = rdb.TTL(context.Background(), f.e.Store().Keys(0).Res(strings.TrimPrefix(r.Reservation.ID, "0."))).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl != -1 {
		t.Fatalf("restored hash TTL %s, want none", ttl)
	}
	if got := stock.BackstopFor(math.MaxInt64 - time.Hour); got <= 0 {
		t.Fatalf("BackstopFor overflowed: %s", got)
	}
}

// I4 across a rebuild: a paid request retried after Redis lost its data
// replays its reservation, as before the loss, instead of answering
// LIMIT_EXCEEDED (the rebuilt quota counts the paid unit) or taking a unit
// for a moment (with room in the quota). Its hash is restored as committed.
func TestPaidRequestReplaysAfterARebuild(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, limit := range []int{1, 2} {
			f := newFixture(t, rdb, withAllocation(10), withShards(2), withMaxPerUser(limit))
			ctx := context.Background()
			r := f.reserve("paula", "r", 1)
			if r.Outcome != engine.OutcomeReserved {
				t.Fatal(r.Outcome)
			}
			if co, err := f.e.Checkout(ctx, "paula", r.Reservation.ID, "pay-1"); err != nil || co.Outcome != ledger.CheckoutCommitted {
				t.Fatalf("checkout: %+v %v", co, err)
			}
			if _, err := f.e.Store().DeleteAll(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := f.e.Rebuild(ctx, openGate); err != nil {
				t.Fatal(err)
			}
			before := f.counts()
			again := f.reserve("paula", "r", 1)
			if again.Outcome != engine.OutcomeReplayed || again.Reservation.ID != r.Reservation.ID {
				t.Fatalf("maxPerUser %d: the paid request retried after a rebuild: %+v, want REPLAYED %s", limit, again, r.Reservation.ID)
			}
			if c := f.assertConserved(); c.Available != before.Available || c.Sold != 1 || c.Reserved != 0 {
				t.Fatalf("maxPerUser %d: counts %+v, before the retry %+v", limit, c, before)
			}
		}
	})
}

// A rebuild cut short after it began on every shard (its process died, a
// leadership handover) leaves them REBUILDING at the ledger's new epoch.
// Seeding must not take that for a live sale: nothing else would finish them.
func TestRebuildCutShortIsFinished(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(10), withShards(2))
	ctx := context.Background()
	f.reserve("rita", "r", 1)
	snap, err := f.l.BeginRebuild(ctx, f.cfg.CampaignID, 0)
	if err != nil {
		t.Fatal(err)
	}
	for shard := range 2 {
		if err := f.e.Store().RebuildBegin(ctx, shard, snap.Campaign.Epoch); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.e.SeedSale(ctx, stock.StateOpen, answer(true)); !errors.Is(err, engine.ErrNeedsRebuild) {
		t.Fatalf("seeding over shards left being rebuilt: %v, want ErrNeedsRebuild", err)
	}
	if _, err := f.e.Rebuild(ctx, openGate); err != nil {
		t.Fatal(err)
	}
	if c := f.assertConserved(); c.Available != 9 || c.Reserved != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// TestPartialRebuildAdmitsNothing: a rebuild that fails on one shard (here an
// ACL that keeps the rebuilding client off shard 2's keys) leaves every shard
// closed, the rebuilt ones included, so the sale is as closed as the
// controller's status says until a rebuild succeeds on all of them.
func TestPartialRebuildAdmitsNothing(t *testing.T) {
	srv := testharness.RedisT(t)
	admin := standaloneClient(t, srv.Addr())
	f := newFixture(t, admin, withAllocation(40), withShards(4))
	ctx := context.Background()
	reserveMany(t, f, "held", 6)
	tag := stock.CampaignTag(f.cfg.CampaignID)
	args := []any{"ACL", "SETUSER", "partial", "on", ">pw", "+@all", "&*"}
	for _, n := range []int{0, 1, 3} {
		args = append(args, fmt.Sprintf("~{fs:%s:%d}:*", tag, n))
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	partial := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "partial", Password: "pw"})
	t.Cleanup(func() { _ = partial.Close() })
	e := openEngine(t, f.cfg, partial, f.l)
	// As the controller does before it rebuilds: every shard refuses.
	if _, err := f.e.Store().SetGate(ctx, stock.StateFailClosed, 0); err != nil {
		t.Fatal(err)
	}
	unasked := func() string { t.Fatal("a failed rebuild asked for the gate"); return stock.StateOpen }
	if _, err := e.Rebuild(ctx, unasked); err == nil || !strings.Contains(err.Error(), "shard 2") {
		t.Fatalf("rebuild without access to shard 2: %v", err)
	}
	states, err := f.e.Store().State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.State == stock.StateOpen {
			t.Fatalf("shard %d admits reservations after a failed rebuild: %+v", s.Index, s)
		}
	}
	for i := range 8 {
		if r := f.reserve(fmt.Sprintf("during-%d", i), "r", 1); r.Outcome != engine.OutcomeClosed {
			t.Fatalf("reserve after a failed rebuild: %s", r.Outcome)
		}
	}
	// A rebuild that reaches every shard opens them all, in the state asked
	// for once every shard is rebuilt (and still closed).
	asked := 0
	rep, err := f.e.Rebuild(ctx, func() string {
		asked++
		c, err := f.e.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range c.Shards {
			if sh.State != stock.StateFailClosed {
				t.Errorf("shard %d is %s when the gate is asked", sh.Index, sh.State)
			}
		}
		if c.Available != 34 || c.Reserved != 6 {
			t.Errorf("the gate was asked before every shard was rebuilt: %+v", c)
		}
		return stock.StateOpen
	})
	if err != nil {
		t.Fatal(err)
	}
	if asked != 1 || rep.Gate != stock.StateOpen {
		t.Fatalf("gate asked %d times, report says %q", asked, rep.Gate)
	}
	if c := f.assertConserved(); c.Reserved != 6 || c.Available != 34 {
		t.Fatalf("after the full rebuild: %+v", c)
	}
	if r := f.reserve("after", "r", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatalf("reserve after the full rebuild: %s", r.Outcome)
	}
}

// A rebuild held before shard 2 of 4 is finished shows 2 of 4 from the
// ledger and the shards alone, at the epoch its Begun hook was told; let go,
// it finishes all 4, and its report says how long it ran.
func TestRebuildProgressFromTheWorld(t *testing.T) {
	rdb := standaloneClient(t, testharness.RedisT(t).Addr())
	const shards = 4
	f := newFixture(t, rdb, withAllocation(40), withShards(shards))
	ctx := context.Background()
	if _, err := f.e.RebuildWith(ctx, engine.RebuildOptions{}); !errors.Is(err, engine.ErrInvalid) {
		t.Fatalf("a rebuild without a gate: %v", err)
	}
	if p, err := f.e.RebuildProgress(ctx); err != nil || !p.Started.IsZero() || p.Shards != shards || p.Finished != 0 {
		t.Fatalf("progress before any rebuild: %+v %v", p, err)
	}
	f.reserve("u-1", "r", 1)
	if _, err := f.e.Store().DeleteAll(ctx); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var begun atomic.Int64
	var once sync.Once
	type result struct {
		rep engine.RebuildReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := f.e.RebuildWith(ctx, engine.RebuildOptions{Gate: openGate, Begun: func(e int64) { begun.Store(e) },
			BeforeFinish: func(shard int) {
				if shard >= 2 {
					once.Do(func() { close(held) })
					<-release
				}
			}})
		done <- result{rep, err}
	}()
	select {
	case <-held:
	case r := <-done:
		t.Fatalf("the rebuild ended before the failpoint: %+v %v", r.rep, r.err)
	}
	// Shards 0 and 1 may still be finishing when shard 2 reaches the
	// failpoint; none past them can be.
	var p engine.RebuildProgress
	for deadline := time.Now().Add(time.Minute); p.Finished < 2; {
		var err error
		if p, err = f.e.RebuildProgress(ctx); err != nil || p.Finished > 2 || time.Now().After(deadline) {
			t.Fatalf("progress held before shard 2: %+v %v", p, err)
		}
	}
	if p.Epoch != begun.Load() || p.Epoch < 2 || p.Shards != shards || p.Started.IsZero() {
		t.Fatalf("progress held before shard 2: %+v (begun at epoch %d)", p, begun.Load())
	}
	close(release)
	r := <-done
	if r.err != nil || r.rep.Epoch != p.Epoch || r.rep.Duration <= 0 {
		t.Fatalf("rebuild: %+v %v", r.rep, r.err)
	}
	if p, err := f.e.RebuildProgress(ctx); err != nil || p.Finished != shards || p.Epoch != r.rep.Epoch {
		t.Fatalf("progress once over: %+v %v", p, err)
	}
}

// A Redis server that restarts during a rebuild, from a snapshot taken while
// the rebuild was writing, holds what the snapshot kept of it: the rebuild
// must not open it, whatever its remaining steps found there. Here it
// restarts (its data saved) just before the shard is finished: the new
// process is not the one that began the rebuild, and the finish refuses.
// The next rebuild opens it.
func TestRebuildDoesNotOpenAServerThatRestartedDuringIt(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := standaloneClient(t, r.Addr())
	f := newFixture(t, rdb, withAllocation(10), withShards(1))
	ctx := context.Background()
	f.reserve("u-1", "r", 1)
	if _, err := f.e.Store().DeleteAll(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := f.e.RebuildWith(ctx, engine.RebuildOptions{Gate: openGate, BeforeFinish: func(int) {
		if err := r.RestartWithData(); err != nil {
			t.Error(err)
		}
	}})
	if !errors.Is(err, engine.ErrServerChanged) {
		t.Fatalf("a rebuild across a server restart: %v, want ErrServerChanged", err)
	}
	states, err := f.e.Store().State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := states[0].State; st == stock.StateOpen {
		t.Fatalf("the restarted server's shard is %s after the rebuild", st)
	}
	rep, err := f.e.Rebuild(ctx, openGate)
	if err != nil || rep.Reserved != 1 || rep.Available != 9 {
		t.Fatalf("the rebuild after: %+v %v", rep, err)
	}
	if states, err := f.e.Store().State(ctx); err != nil || states[0].State != stock.StateOpen {
		t.Fatalf("after the next rebuild: %+v %v", states, err)
	}
}
