package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Failure matrix: Redis restarted empty mid-storm. Every shard closes at once (no
// meta), the rebuild from the ledger restores exact counts, the storm goes on, and
// reservations acknowledged before the loss still check out.
func TestRedisLostMidStormThenRebuilt(t *testing.T) {
	for _, b := range []struct {
		name    string
		restart func(t *testing.T) (redis.UniversalClient, func() error)
	}{
		{"standalone", func(t *testing.T) (redis.UniversalClient, func() error) {
			r := testharness.RedisT(t)
			return standaloneClient(t, r.Addr()), r.RestartEmpty
		}},
		{"cluster", func(t *testing.T) (redis.UniversalClient, func() error) {
			c := testharness.RedisClusterT(t)
			return clusterClient(t, c.Addrs()), c.RestartEmpty
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			rdb, restartEmpty := b.restart(t)
			f := newFixture(t, rdb, withAllocation(600), withShards(6), withMaxPerUser(1))
			ctx := context.Background()
			before := storm(t, f, 300, "early", nil)
			if len(before) != 300 {
				t.Fatalf("%d acknowledged before the loss", len(before))
			}
			// Commit some of them so the rebuild has sold units to account for.
			for i, r := range before[:100] {
				if co, err := f.e.Checkout(ctx, userOf(t, f, r.ID), r.ID, fmt.Sprintf("pay-%d", i)); err != nil || co.Outcome != ledger.CheckoutCommitted {
					t.Fatalf("checkout: %v %v", co.Outcome, err)
				}
			}
			var closed, unavailable, after atomic.Int64
			var wg sync.WaitGroup
			var during []engine.Reservation
			wg.Add(1)
			go func() {
				defer wg.Done()
				during = storm(t, f, 400, "during", func(r engine.ReserveResult, err error) {
					switch {
					case errors.Is(err, engine.ErrUnavailable):
						unavailable.Add(1)
					case err != nil:
						t.Errorf("reserve: %v", err)
					case r.Outcome == engine.OutcomeClosed:
						closed.Add(1)
					case r.Outcome == engine.OutcomeReserved:
						after.Add(1)
					}
				})
			}()
			time.Sleep(20 * time.Millisecond)
			if err := restartEmpty(); err != nil {
				t.Fatal(err)
			}
			// Every shard is closed at once: no meta anywhere.
			// By key, as the reserve pods' readiness does: a keyless PING can
			// meet a slot map reloaded from a node not yet joined.
			testharness.Eventually(t, 30*time.Second, "redis back", func() bool { return f.e.Store().Ping(ctx) == nil })
			h, err := f.e.Check(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !h.Lost() || len(h.Missing) != f.cfg.Shards {
				t.Fatalf("health after loss: %+v", h)
			}
			if r, err := f.e.Reserve(ctx, "probe", "p", 1); err != nil || r.Outcome != engine.OutcomeClosed || r.Reason != stock.ReasonNoMeta {
				t.Fatalf("reserve on lost redis: %+v %v", r, err)
			}
			if _, err := f.e.Seed(ctx, stock.StateOpen); !errors.Is(err, engine.ErrNeedsRebuild) {
				t.Fatalf("seed after loss must refuse: %v", err)
			}
			rep, err := f.e.Rebuild(ctx, openGate)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Epoch != 2 || rep.Sold != 100 {
				t.Fatalf("rebuild report %+v", rep)
			}
			wg.Wait()
			f.sweepUntilQuiet()
			c := f.assertConserved()
			if c.Sold != 100 || c.Epoch != 2 {
				t.Fatalf("counts %+v", c)
			}
			f.assertLedgerHolds(append(slices.Clone(before[100:]), during...), before[:100])
			t.Logf("during the loss: %d closed, %d unavailable, %d reserved; rebuild %+v", closed.Load(), unavailable.Load(), after.Load(), rep)
			// Acknowledged before the loss and not yet paid: still checkout-able.
			for i, r := range before[100:] {
				co, err := f.e.Checkout(ctx, userOf(t, f, r.ID), r.ID, fmt.Sprintf("pay-late-%d", i))
				if err != nil || co.Outcome != ledger.CheckoutCommitted {
					t.Fatalf("checkout of %s acknowledged before the loss: %v %v", r.ID, co.Outcome, err)
				}
			}
			// And the per-user limit survived the rebuild.
			if r := f.reserve(userOf(t, f, before[0].ID), "another", 1); r.Outcome != engine.OutcomeLimit {
				t.Fatalf("limit after rebuild: %s", r.Outcome)
			}
			c = f.assertConserved()
			if c.Sold != 300 {
				t.Fatalf("sold %d, want 300", c.Sold)
			}
		})
	}
}

// assertLedgerHolds checks the ledger's live rows id by id: exactly the given
// reservations are PENDING and exactly the given ones COMMITTED. Counting rows
// would let a reservation acknowledged without its row and a refused one
// written anyway cancel out.
func (f *fixture) assertLedgerHolds(pending, committed []engine.Reservation) {
	f.t.Helper()
	want := map[string]ledger.Status{}
	for _, r := range pending {
		want[r.ID] = ledger.StatusPending
	}
	for _, r := range committed {
		want[r.ID] = ledger.StatusCommitted
	}
	rows, err := f.l.Pool().Query(context.Background(),
		`SELECT reservation_id, status FROM flashsale_orders WHERE campaign_id = $1 AND status IN ('PENDING', 'COMMITTED')`, f.cfg.CampaignID)
	if err != nil {
		f.t.Fatal(err)
	}
	got := map[string]ledger.Status{}
	var id, status string
	if _, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error {
		got[id] = ledger.Status(status)
		return nil
	}); err != nil {
		f.t.Fatal(err)
	}
	for id, s := range want {
		if got[id] != s {
			f.t.Errorf("acknowledged %s: ledger status %q, want %s", id, got[id], s)
		}
	}
	for id, s := range got {
		if _, ok := want[id]; !ok {
			f.t.Errorf("ledger row %s is %s but was never acknowledged", id, s)
		}
	}
}

func userOf(t *testing.T, f *fixture, id string) string {
	t.Helper()
	o, err := f.l.GetOrder(context.Background(), f.e.Config().CampaignID, id)
	if err != nil {
		t.Fatal(err)
	}
	return o.UserID
}

// Scripts run by SHA and reload themselves after NOSCRIPT. After a restart
// with data (the script cache is empty, the shards are live) the reload comes
// with the new server's run id: the shards refuse (UNVERIFIED) until they are
// rebuilt, because the data may be older than the ledger. After SCRIPT FLUSH
// (same server) the reload is all that happens.
func TestNoScriptAfterRestartWithDataAndFlush(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := standaloneClient(t, r.Addr())
	f := newFixture(t, rdb, withAllocation(24), withShards(12))
	ctx := context.Background()
	f.reserve("pia", "r", 1)
	before := testharness.RunID(t, rdb)
	if err := r.RestartWithData(); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 10*time.Second, "redis back", func() bool { return rdb.Ping(ctx).Err() == nil })
	if ok, err := rdb.ScriptExists(ctx, stock.ReserveScriptFor(before).Hash()).Result(); err != nil || ok[0] {
		t.Fatalf("script cache survived the restart (%v, %v): the test would prove nothing", ok, err)
	}
	h, err := f.e.Check(ctx, 1)
	if err != nil || len(h.Missing)+len(h.Stale) > 0 || len(h.Unverified) != f.cfg.Shards || !h.Lost() {
		t.Fatalf("the data survived on a new server process: %+v %v", h, err)
	}
	if res := f.reserve("quinn", "r", 1); res.Outcome != engine.OutcomeClosed || res.Reason != stock.ReasonUnverified {
		t.Fatalf("after NOSCRIPT on a restarted server: %+v", res)
	}
	// As the controller reports it: the first shards named, the rest counted.
	if _, err := f.e.SeedSale(ctx, stock.StateOpen, answer(true)); !errors.Is(err, engine.ErrNeedsRebuild) ||
		!strings.Contains(err.Error(), "shards [0 1 2 3 4 5 6 7] and 4 more hold data") {
		t.Fatalf("seeding after the restart: %v", err)
	}
	if _, err := f.e.Rebuild(ctx, openGate); err != nil {
		t.Fatal(err)
	}
	if res := f.reserve("quinn", "r", 1); res.Outcome != engine.OutcomeReserved {
		t.Fatalf("after the rebuild: %s", res.Outcome)
	}
	if res := f.reserve("pia", "r", 1); res.Outcome != engine.OutcomeReplayed {
		t.Fatalf("replay after restart: %s", res.Outcome)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if res := f.reserve("rita", "r", 1); res.Outcome != engine.OutcomeReserved {
		t.Fatalf("after SCRIPT FLUSH: %+v", res)
	}
	if h, err := f.e.Check(ctx, 2); err != nil || h.Lost() {
		t.Fatalf("after SCRIPT FLUSH: %+v %v", h, err)
	}
	f.assertConserved()
}

// A Redis that restarts from an older snapshot (or a replica promoted after
// missing the last writes) keeps its meta, epoch and OPEN gate, but not the
// reservations made since: selling its stock would sell those units twice.
// Its shards refuse from the first call, before any controller notices, and
// the rebuild restores the ledger's counts.
func TestStaleSnapshotRefusedUntilRebuilt(t *testing.T) {
	for _, b := range []struct {
		name  string
		start func(t *testing.T) (redis.UniversalClient, []*testharness.Redis)
	}{
		{"standalone", func(t *testing.T) (redis.UniversalClient, []*testharness.Redis) {
			r := testharness.RedisT(t)
			return standaloneClient(t, r.Addr()), []*testharness.Redis{r}
		}},
		{"cluster", func(t *testing.T) (redis.UniversalClient, []*testharness.Redis) {
			c := testharness.RedisClusterT(t)
			return clusterClient(t, c.Addrs()), c.Nodes()
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			rdb, servers := b.start(t)
			f := newFixture(t, rdb, withAllocation(40), withShards(4))
			ctx := context.Background()
			reserveMany(t, f, "early", 5)
			for _, srv := range servers {
				c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
				err := c.Save(ctx).Err()
				_ = c.Close()
				if err != nil {
					t.Fatal(err)
				}
			}
			reserveMany(t, f, "late", 5) // acknowledged, in the ledger, not in the snapshot
			for _, srv := range servers {
				if err := srv.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			for _, srv := range servers {
				if err := srv.Start(); err != nil {
					t.Fatal(err)
				}
			}
			var res engine.ReserveResult
			testharness.Eventually(t, 20*time.Second, "an answer from the restarted servers", func() bool {
				var err error
				res, err = f.e.Reserve(ctx, "buyer", "r", 1)
				return err == nil
			})
			if res.Outcome != engine.OutcomeClosed || res.Reason != stock.ReasonUnverified {
				t.Fatalf("the first reserve on the snapshot: %+v", res)
			}
			// Every node answers reads once the cluster agrees again (a node
			// can answer a script while another still says CLUSTERDOWN).
			var n engine.Counts
			testharness.Eventually(t, 20*time.Second, "counts from the restarted servers", func() bool {
				var err error
				n, err = f.e.Counts(ctx)
				return err == nil
			})
			if n.Available != 35 {
				t.Fatalf("the snapshot's stock should still be there, unused: %+v", n)
			}
			if _, err := f.e.Seed(ctx, stock.StateOpen); !errors.Is(err, engine.ErrNeedsRebuild) {
				t.Fatalf("seed over the snapshot: %v", err)
			}
			rep, err := f.e.Rebuild(ctx, openGate)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Available != 30 || rep.Reserved != 10 {
				t.Fatalf("rebuild %+v", rep)
			}
			if res := f.reserve("buyer", "r", 1); res.Outcome != engine.OutcomeReserved {
				t.Fatalf("after the rebuild: %+v", res)
			}
			if c := f.assertConserved(); c.Available != 29 || c.Reserved != 11 {
				t.Fatalf("counts %+v", c)
			}
		})
	}
}
