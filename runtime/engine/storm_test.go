package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
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

// stormWorkers bounds live goroutines (the race detector allows 8128).
const stormWorkers = 400

// storm runs buyers users against the engine, each with one request, from many
// goroutines, and returns the acknowledged reservations. onResult may be nil.
func storm(t *testing.T, f *fixture, buyers int, prefix string, onResult func(engine.ReserveResult, error)) []engine.Reservation {
	t.Helper()
	var (
		mu    sync.Mutex
		acked []engine.Reservation
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	for range stormWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(buyers) {
					return
				}
				r, err := f.e.Reserve(context.Background(), fmt.Sprintf("%s-%d", prefix, i), "req", 1)
				if onResult != nil {
					onResult(r, err)
				}
				if err == nil && r.Outcome == engine.OutcomeReserved {
					mu.Lock()
					acked = append(acked, r.Reservation)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return acked
}

// The storm of the issue: 10,000 concurrent buyers on 1,000 units in 10 shards with
// stealProbes 2. No oversell at any sampled moment, every unit reserved by the end,
// conservation exact, every acknowledgement in the ledger.
func TestStorm(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(1000), withShards(10), withSteal(2))
		stop := make(chan struct{})
		var samples, acks atomic.Int64
		var sampler sync.WaitGroup
		sampler.Add(1)
		go func() {
			defer sampler.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				// Read before the counts, so that acks never exceed what the
				// ledger held when it was read.
				acked := acks.Load()
				c, err := f.e.Counts(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				// Checked against what did not come from the same counters:
				// the acknowledgements made so far, and the ledger's rows per
				// shard against each shard's allocation.
				if acked > c.Allocation || acked > c.Pending+c.Sold {
					t.Errorf("I1/I3 mid-storm: %d reservations acknowledged, the ledger holds %d pending and %d sold of %d", acked, c.Pending, c.Sold, c.Allocation)
				}
				for _, s := range c.Shards {
					if s.Available < 0 || s.Reserved < 0 || s.Pending+s.Sold > s.Allocation {
						t.Errorf("I1 violated mid-storm on shard %d: %+v", s.Index, s)
					}
				}
				samples.Add(1)
			}
		}()
		outcomes := map[engine.Outcome]int{}
		var omu sync.Mutex
		acked := storm(t, f, 10_000, "buyer", func(r engine.ReserveResult, err error) {
			if err != nil {
				t.Errorf("reserve: %v", err)
				return
			}
			if r.Outcome == engine.OutcomeReserved {
				acks.Add(1)
			}
			omu.Lock()
			outcomes[r.Outcome]++
			omu.Unlock()
		})
		close(stop)
		sampler.Wait()
		if samples.Load() == 0 {
			t.Fatal("no sample taken during the storm")
		}
		if len(acked) != 1000 {
			t.Fatalf("%d reservations acknowledged for 1000 units (outcomes %v)", len(acked), outcomes)
		}
		if outcomes[engine.OutcomeSoldOut] != 9000 {
			t.Fatalf("outcomes %v", outcomes)
		}
		c := f.assertConserved()
		if c.Available != 0 || c.Reserved != 1000 || c.Pending != 1000 {
			t.Fatalf("counts %+v", c)
		}
		seen := map[string]bool{}
		for _, r := range acked {
			if seen[r.ID] {
				t.Fatalf("reservation %s acknowledged twice", r.ID)
			}
			seen[r.ID] = true
			if s := orderStatus(t, f, r.ID); s != ledger.StatusPending {
				t.Fatalf("I3: acknowledged %s has ledger status %q", r.ID, s)
			}
		}
		t.Logf("%d samples, outcomes %v", samples.Load(), outcomes)
	})
}

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
			rep, err := f.e.Rebuild(ctx, gate(stock.StateOpen))
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
	o, err := f.l.GetOrder(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return o.UserID
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
			if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
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

// Failure matrix: PostgreSQL down. Reserve fails cleanly (ErrUnavailable) and
// nothing is acknowledged. A unit whose ledger write certainly failed comes back at
// once; one whose commit outcome is unknown (the connection broke mid-statement) is
// held until it expires, then the sweeper records it abandoned and releases it.
func TestLedgerDown(t *testing.T) {
	pg := testharness.PostgresT(t)
	f := newFixtureOn(t, standaloneClient(t, sharedRedis.Addr()), pg, withAllocation(10), withTTL(time.Second, 0))
	ctx := context.Background()
	if r := f.reserve("nina", "r1", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatal(r.Outcome)
	}
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := f.e.Reserve(c, fmt.Sprintf("olga-%d", i), "r", 1)
		cancel()
		if !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("reserve with the ledger down: %v", err)
		}
		if i == 0 && r.Calls != 1 {
			// The first ran the script before its write failed: the metric counts it.
			t.Fatalf("%d script calls reported for a reservation whose write failed", r.Calls)
		}
	}
	// Once a write failed, reservations are refused before they take a unit
	// until the ledger answers again.
	var wg sync.WaitGroup
	var guarded atomic.Int64
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := f.e.Reserve(ctx, fmt.Sprintf("olga-%d", 5+i), "r", 1)
			if !errors.Is(err, engine.ErrUnavailable) {
				t.Errorf("reserve with the ledger down: %v", err)
			} else if strings.Contains(err.Error(), "no unit is taken") {
				guarded.Add(1)
			}
		}()
	}
	wg.Wait()
	if guarded.Load() == 0 {
		t.Fatal("every reservation took a unit while the ledger was down")
	}
	// And so it stays while the ledger does not answer, however long.
	time.Sleep(1500 * time.Millisecond)
	if _, err := f.e.Reserve(ctx, "olga-late", "r", 1); err == nil || !strings.Contains(err.Error(), "no unit is taken") {
		t.Fatalf("reserve 1.5 s into the outage: %v", err)
	}
	st, err := f.e.Store().State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var avail, rsv int64
	for _, s := range st {
		avail += s.Available
		rsv += s.Reserved
	}
	if avail+rsv != 10 || rsv < 1 {
		t.Fatalf("I1: available %d + reserved %d != 10", avail, rsv)
	}
	t.Logf("with the ledger down: %d units given back at once, %d held until expiry", 5-(rsv-1), rsv-1)
	// Only a batch sent on a connection that was open when PostgreSQL stopped
	// can be in doubt; once no connection can be had, nothing was sent and the
	// unit comes back at once.
	if rsv-1 > 1 {
		t.Fatalf("%d units held until expiry, want at most 1", rsv-1)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	testharness.Eventually(t, 15*time.Second, "the sweeper releases every expired unit", func() bool {
		_, err := f.e.Sweep(ctx)
		c, cerr := f.e.Counts(ctx)
		return err == nil && cerr == nil && c.Available == 10 && c.Reserved == 0
	})
	c := f.assertConserved()
	if c.Sold != 0 || c.Pending != 0 {
		t.Fatalf("%+v", c)
	}
	// The ledger answers again: reservations go through, without one having
	// to be written first.
	testharness.Eventually(t, 10*time.Second, "reservations let through again", func() bool {
		_, err := f.e.Reserve(ctx, "olga-0", "r2", 1)
		return err == nil
	})
	if r := f.reserve("olga-0", "r2", 1); r.Outcome != engine.OutcomeReplayed {
		t.Fatalf("after the ledger is back: %s", r.Outcome)
	}
}

// A ledger that hangs (here a lock on the orders table) is found out within
// LedgerStallAfter (2 s): the reservations after that answer ErrUnavailable
// (retry) before taking a unit, instead of draining the stock into units
// the ledger cannot record, which told every later buyer SOLD_OUT. Once the
// ledger answers, the units taken meanwhile are sold or given back.
func TestLedgerThatHangsDoesNotSellOut(t *testing.T) {
	// Batches time out after 10 s here, far from the 4 s hang: a write that
	// timed out would leave its units held until they expire.
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(60), withShards(2),
		withMaterializer(ledger.MaterializerConfig{Timeout: 10 * time.Second}))
	ctx := context.Background()
	tx, err := f.l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE flashsale_orders IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	// A buyer every 50 ms for 3.8 s: without the guard the first 60 drain
	// the stock within 3 s and the later ones are told SOLD_OUT. The lock
	// goes at 4 s.
	var (
		wg                             sync.WaitGroup
		reserved, soldOut, unavailable atomic.Int64
	)
	start := time.Now()
	for i := 0; time.Since(start) < 3800*time.Millisecond; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := f.e.Reserve(ctx, fmt.Sprintf("hung-%d", i), "r", 1)
			switch {
			case errors.Is(err, engine.ErrUnavailable):
				unavailable.Add(1)
			case err != nil:
				t.Errorf("reserve: %v", err)
			case res.Outcome == engine.OutcomeSoldOut:
				soldOut.Add(1)
			case res.Outcome == engine.OutcomeReserved:
				reserved.Add(1)
			}
		}()
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Until(start.Add(4 * time.Second)))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("reserved %d, unavailable %d, sold out %d", reserved.Load(), unavailable.Load(), soldOut.Load())
	if soldOut.Load() != 0 {
		t.Fatalf("%d buyers told SOLD_OUT while the ledger hung with units to sell", soldOut.Load())
	}
	if unavailable.Load() == 0 {
		t.Fatal("no reservation refused while the ledger hung")
	}
	if c := f.assertConserved(); c.Reserved != reserved.Load() || c.Pending != reserved.Load() {
		t.Fatalf("after the hang: %+v, %d acknowledged", c, reserved.Load())
	}
	if r := f.reserve("after", "r", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatalf("after the ledger answers again: %s", r.Outcome)
	}
}

// A ledger that failed a write and answers again lets every reservation
// through even when none would write (here the sale has ended): they get
// their answer, not a retry.
func TestLedgerBackWithoutWrites(t *testing.T) {
	pg := testharness.PostgresT(t)
	f := newFixtureOn(t, standaloneClient(t, sharedRedis.Addr()), pg, withAllocation(10))
	ctx := context.Background()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.Reserve(ctx, "first", "r", 1); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("reserve with the ledger down: %v", err)
	}
	if err := f.e.SetGate(ctx, stock.StateEnded, 0); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 15*time.Second, "every buyer told the sale ended", func() bool {
		var wg sync.WaitGroup
		var ended atomic.Int64
		for i := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r, err := f.e.Reserve(ctx, fmt.Sprintf("late-%d", i), "r", 1); err == nil && r.Reason == stock.StateEnded {
					ended.Add(1)
				}
			}()
		}
		wg.Wait()
		return ended.Load() == 5
	})
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
	before := serverRunID(t, rdb)
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
	if _, err := f.e.SeedSale(ctx, stock.StateOpen, true); !errors.Is(err, engine.ErrNeedsRebuild) ||
		!strings.Contains(err.Error(), "shards [0 1 2 3 4 5 6 7] and 4 more hold data") {
		t.Fatalf("seeding after the restart: %v", err)
	}
	if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
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
			rep, err := f.e.Rebuild(ctx, gate(stock.StateOpen))
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

// A shard whose meta names another server (what a replica promoted by a
// failover carries: the meta its old master wrote) refuses until rebuilt, and
// Check reports it.
func TestShardFromAnotherServerRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(20), withShards(2), withSteal(0))
		ctx := context.Background()
		if err := rdb.HSet(ctx, f.e.Store().Keys(1).Meta(), "srv", "0123456789abcdef0123456789abcdef01234567").Err(); err != nil {
			t.Fatal(err)
		}
		h, err := f.e.Check(ctx, 1)
		if err != nil || len(h.Unverified) != 1 || h.Unverified[0] != 1 {
			t.Fatalf("check %+v %v", h, err)
		}
		var refused, taken int
		for i := range 20 {
			switch r := f.reserve(fmt.Sprintf("u-%d", i), "r", 1); {
			case r.Outcome == engine.OutcomeClosed && r.Reason == stock.ReasonUnverified:
				refused++
			case r.Outcome == engine.OutcomeReserved && r.Reservation.Shard == 0:
				taken++
			default:
				t.Fatalf("%+v", r)
			}
		}
		if refused == 0 || taken == 0 {
			t.Fatalf("refused %d, taken %d: both shards should have been tried", refused, taken)
		}
		if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
			t.Fatal(err)
		}
		if h, err := f.e.Check(ctx, 2); err != nil || h.Lost() {
			t.Fatalf("after the rebuild: %+v %v", h, err)
		}
		f.assertConserved()
	})
}

// userHomedOn is the first user "<prefix>-N" whose home is shard.
func userHomedOn(prefix string, shard, shards int) string {
	for i := 0; ; i++ {
		if u := fmt.Sprintf("%s-%d", prefix, i); stock.HomeShard(u, shards) == shard {
			return u
		}
	}
}

// unverifiedUntilRebuilt checks what a shard 0 now held by another server
// process (named where) does: user's first reserve that gets an answer is
// refused as UNVERIFIED, Check reports shard 0, and after a rebuild the same
// request is reserved. It returns Check's report.
func (f *fixture) unverifiedUntilRebuilt(user, where string) engine.Health {
	f.t.Helper()
	ctx := context.Background()
	var res engine.ReserveResult
	testharness.Eventually(f.t, 20*time.Second, "an answer from "+where, func() bool {
		var err error
		res, err = f.e.Reserve(ctx, user, "r", 1)
		return err == nil
	})
	if res.Outcome != engine.OutcomeClosed || res.Reason != stock.ReasonUnverified {
		f.t.Fatalf("the first reserve on %s: %+v", where, res)
	}
	h, err := f.e.Check(ctx, 1)
	if err != nil || !slices.Contains(h.Unverified, 0) {
		f.t.Fatalf("check %+v %v", h, err)
	}
	if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
		f.t.Fatal(err)
	}
	if res := f.reserve(user, "r", 1); res.Outcome != engine.OutcomeReserved {
		f.t.Fatalf("after the rebuild: %+v", res)
	}
	return h
}

// A replica promoted by a cluster failover carries the meta its old master
// wrote: its shards refuse from the first call that reaches it, even though
// this failover lost nothing (the design cannot know), and the rebuild opens
// them again.
func TestFailoverRefusedUntilRebuilt(t *testing.T) {
	c := testharness.RedisClusterWithReplicasT(t)
	rdb := clusterClient(t, c.Addrs())
	f := newFixture(t, rdb, withAllocation(40), withShards(4))
	ctx := context.Background()
	reserveMany(t, f, "early", 8)
	user := userHomedOn("buyer", 0, 4)
	slot := int(rdb.(*redis.ClusterClient).ClusterKeySlot(ctx, f.e.Store().Keys(0).Meta()).Val())
	if _, err := c.Failover(slot); err != nil {
		t.Fatal(err)
	}
	f.unverifiedUntilRebuilt(user, "the promoted replica")
	if n := f.assertConserved(); n.Reserved != 9 {
		t.Fatalf("counts %+v", n)
	}
}

// A resharding that moves a live shard's slot to another master while buyers
// keep reserving carries the shard's meta there, stamped by the old master: the
// shard refuses (UNVERIFIED) until it is rebuilt, nothing is oversold, and the
// rebuild gives back exactly the ledger's counts.
func TestReshardRefusedUntilRebuilt(t *testing.T) {
	c := testharness.RedisClusterT(t)
	rdb := clusterClient(t, c.Addrs())
	f := newFixture(t, rdb, withAllocation(400), withShards(4))
	ctx := context.Background()
	reserveMany(t, f, "early", 8)
	user := userHomedOn("buyer", 0, 4)

	// Buyers on every shard while the slot moves; errors (the moving shard's
	// TRYAGAIN and ASK answers) are refusals.
	var acked atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := f.e.Reserve(ctx, fmt.Sprintf("during-%d-%d", g, i), "r", 1)
				if err == nil && r.Outcome == engine.OutcomeReserved {
					acked.Add(1)
				}
			}
		})
	}
	slot := int(rdb.(*redis.ClusterClient).ClusterKeySlot(ctx, f.e.Store().Keys(0).Meta()).Val())
	moved := false
	for _, n := range c.Nodes() {
		if err := c.MoveSlot(slot, n); err == nil {
			moved = true
			break
		} else if !strings.Contains(err.Error(), "already serves") {
			close(stop)
			wg.Wait()
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if !moved {
		t.Fatal("the slot did not move")
	}
	t.Logf("%d reservations acknowledged while the slot moved", acked.Load())
	f.assertNoOversell()

	if h := f.unverifiedUntilRebuilt(user, "the new master"); len(h.Unverified) != 1 {
		t.Fatalf("only the moved shard should be unverified: %+v", h)
	}
	want := 8 + acked.Load() + 1
	if n := f.assertConserved(); n.Reserved != want || n.Available != 400-want {
		t.Fatalf("counts %+v, want %d reserved", n, want)
	}
}

// The run ids the controller compares are those of the servers holding the
// sale's shards: in a shared cluster a restart or a new master elsewhere is not
// this sale's data loss and must not close it for a rebuild.
func TestRunIDsAreTheShardsServers(t *testing.T) {
	rdb := clusterClient(t, sharedCluster.Addrs())
	f := newFixture(t, rdb, withAllocation(10), withShards(1))
	ctx := context.Background()
	master, err := rdb.(*redis.ClusterClient).MasterForKey(ctx, f.e.Store().Keys(0).Meta())
	if err != nil {
		t.Fatal(err)
	}
	h, err := f.e.Check(ctx, 1)
	if err != nil || h.Lost() {
		t.Fatalf("check: %+v, %v", h, err)
	}
	if len(h.RunIDs) != 1 || h.RunIDs[master.Options().Addr] == "" {
		t.Fatalf("run ids %v, want only the shard's master %s (of %d masters)", h.RunIDs, master.Options().Addr, len(sharedCluster.Addrs()))
	}
}

// A reservation hash outlives its reservation's whole lifetime (TTL and
// grace) by the backstop: with a TTL beyond the default 24 h backstop, a hash
// that expired first would take its unit with it.
func TestBackstopOutlivesLongReservations(t *testing.T) {
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
	if want := 31*time.Hour + stock.DefaultBackstop - time.Minute; ttl < want {
		t.Fatalf("reservation hash TTL %s, want at least %s", ttl, want)
	}

	// The TTL is lowered, then Redis is rebuilt: the restored hash still
	// outlives the reservation's own expiry, 30 h away, not the new TTL's.
	cfg := f.cfg
	cfg.TTL = 10 * time.Minute
	e := openEngine(t, cfg, rdb, f.l)
	if _, err := e.Rebuild(context.Background(), gate(stock.StateOpen)); err != nil {
		t.Fatal(err)
	}
	ttl, err = rdb.TTL(context.Background(), f.e.Store().Keys(0).Res(strings.TrimPrefix(r.Reservation.ID, "0."))).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := 30*time.Hour + stock.DefaultBackstop - time.Minute; ttl < want {
		t.Fatalf("restored hash TTL %s, want at least %s", ttl, want)
	}
	if got := stock.BackstopFor(math.MaxInt64 - time.Hour); got <= 0 {
		t.Fatalf("BackstopFor overflowed: %s", got)
	}
}

// Readiness pings the shards' servers by key: a cluster client whose slot map
// came back empty (reloaded from a node not yet joined, during a whole-cluster
// restart) fails a keyless PING until its next refresh; by key it reaches a
// known node.
func TestPingAnswersWithAnEmptySlotMap(t *testing.T) {
	f := newFixture(t, clusterClient(t, sharedCluster.Addrs()), withAllocation(10), withShards(3))
	empty := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        sharedCluster.Addrs(),
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { return nil, nil },
	})
	t.Cleanup(func() { _ = empty.Close() })
	ctx := context.Background()
	if err := empty.Ping(ctx).Err(); err == nil {
		t.Fatal("a keyless PING with an empty slot map answered: the test shows nothing")
	}
	if err := stock.New(empty, f.cfg.CampaignID, 3).Ping(ctx); err != nil {
		t.Fatalf("Store.Ping: %v", err)
	}
}

// Shards seeded before metas recorded their server (no srv) keep selling, and
// Stamp records the server once, after which a restart is caught as for any
// other shard.
func TestStampShardsWithoutServer(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := standaloneClient(t, r.Addr())
	f := newFixture(t, rdb, withAllocation(30), withShards(3))
	ctx := context.Background()
	for i := range 3 {
		if err := rdb.HDel(ctx, f.e.Store().Keys(i).Meta(), "srv").Err(); err != nil {
			t.Fatal(err)
		}
	}
	reserveMany(t, f, "old", 3)
	if n, err := f.e.Store().Stamp(ctx); err != nil || n != 3 {
		t.Fatalf("stamped %d, %v", n, err)
	}
	if n, err := f.e.Store().Stamp(ctx); err != nil || n != 0 {
		t.Fatalf("stamped again: %d, %v", n, err)
	}
	id := serverRunID(t, rdb)
	for i := range 3 {
		if got := rdb.HGet(ctx, f.e.Store().Keys(i).Meta(), "srv").Val(); got != id {
			t.Fatalf("shard %d srv %q, want %q", i, got, id)
		}
	}
	if err := r.RestartWithData(); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 10*time.Second, "redis back", func() bool { return rdb.Ping(ctx).Err() == nil })
	if res := f.reserve("new", "r", 1); res.Outcome != engine.OutcomeClosed || res.Reason != stock.ReasonUnverified {
		t.Fatalf("after the restart: %+v", res)
	}
}

// serverRunID is the run_id of a standalone server.
func serverRunID(t *testing.T, rdb redis.UniversalClient) string {
	t.Helper()
	info, err := rdb.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v
		}
	}
	t.Fatal("no run_id in INFO server")
	return ""
}

// Restock adds the delta exactly once, also when repeated or resumed.
// An allocation change meets a rebuild started by another operator (a
// leadership handover while one was mid-reconcile). The rebuild writes each
// shard from its own snapshot of the ledger, so a change applied under it
// would be undone (a restock lost for good) or miss it (a decrease whose
// withdrawn units the rebuild put back, then sold: an oversell). Such a change
// is refused, and applied once the rebuild is done.
func TestAllocationChangeDuringARebuildIsRefused(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(100), withShards(4))
	ctx := context.Background()
	reserveMany(t, f, "held", 10)
	camp, err := f.l.GetCampaign(ctx, f.cfg.CampaignID)
	if err != nil {
		t.Fatal(err)
	}
	// The other operator's rebuild has bumped the epoch; its shards are not written yet.
	if _, err := f.l.BeginRebuild(ctx, f.cfg.CampaignID, 0); err != nil {
		t.Fatal(err)
	}
	before := f.counts()
	if _, err := f.e.ApplyAllocation(ctx, 140); !errors.Is(err, stock.ErrRebuilt) {
		t.Fatalf("a restock during a rebuild: %v, want ErrRebuilt", err)
	}
	if c := f.counts(); c.Available != before.Available || c.Withdrawn != 0 {
		t.Fatalf("the refused restock changed the shards: %+v, before %+v", c, before)
	}
	// Units withdrawn under the old epoch cannot be recorded as a decrease.
	if _, _, err := f.e.Store().Withdraw(ctx, 0, camp.Epoch+1, 5); !errors.Is(err, stock.ErrRebuilt) {
		t.Fatalf("a withdrawal under the new epoch from a shard of the old: %v", err)
	}
	if _, err := f.l.RecordAllocationDecrease(ctx, f.cfg.CampaignID, camp.Epoch, 140, 120, []int64{-5, -5, -5, -5}); !errors.Is(err, ledger.ErrEpochChanged) {
		t.Fatalf("a decrease withdrawn under the old epoch: %v, want ErrEpochChanged", err)
	}
	// A decrease through the engine is refused too.
	if _, err := f.e.ApplyAllocation(ctx, 60); !errors.Is(err, stock.ErrRebuilt) {
		t.Fatalf("a decrease during a rebuild: %v, want ErrRebuilt", err)
	}
	// The rebuild done, the restock recorded meanwhile is applied once.
	f.restockAfterRebuild(140, 130)
}

// restockAfterRebuild finishes a rebuild, asks for the allocation target
// twice (the second call finds nothing to do) and checks the counts.
func (f *fixture) restockAfterRebuild(target, available int64) {
	f.t.Helper()
	ctx := context.Background()
	if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
		f.t.Fatal(err)
	}
	for range 2 {
		if _, err := f.e.ApplyAllocation(ctx, target); err != nil {
			f.t.Fatal(err)
		}
	}
	if c := f.assertConserved(); c.Allocation != target || c.Available != available {
		f.t.Fatalf("counts after the rebuild and the restock: %+v", c)
	}
}

// A restock planned after another operator's rebuild took its snapshot, by
// an engine that read the epoch before the rebuild began, must not reach the
// shards the rebuild has not rewritten yet: the rebuild would overwrite them,
// and the change, marked applied, would never be in Redis.
func TestRestockPlannedAfterARebuildSnapshot(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(100), withShards(4))
	ctx := context.Background()
	reserveMany(t, f, "held", 10)
	before := f.counts()
	lock, err := pgx.ConnectConfig(ctx, f.l.Pool().Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(ctx)
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The engine reads the epoch, then waits for this lock to list the
	// changes; the rebuild bumps the epoch, then waits for it to absorb them.
	if _, err := tx.Exec(ctx, `LOCK TABLE flashsale_allocation_changes IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	dsn := f.l.Pool().Config().ConnString()
	applied := make(chan error, 1)
	go func() {
		_, err := f.e.ApplyAllocation(ctx, 140)
		applied <- err
	}()
	testharness.WaitForLockWaiters(t, dsn, 1, 30*time.Second, "the restock waiting to list the changes")
	rebuilt := make(chan error, 1)
	go func() {
		_, err := f.l.BeginRebuild(ctx, f.cfg.CampaignID, 0)
		rebuilt <- err
	}()
	testharness.WaitForLockWaiters(t, dsn, 2, 30*time.Second, "the rebuild waiting to absorb the changes")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-rebuilt; err != nil {
		t.Fatal(err)
	}
	if err := <-applied; !errors.Is(err, stock.ErrRebuilt) {
		t.Fatalf("a restock planned after the rebuild's snapshot, on shards of the old epoch: %v, want ErrRebuilt", err)
	}
	if c := f.counts(); c.Available != before.Available {
		t.Fatalf("the refused restock changed the shards: %+v, before %+v", c, before)
	}
	// The rebuild done, the restock is in Redis once.
	f.restockAfterRebuild(140, 130)
}

// A decrease that finds units withdrawn on a shard the rebuild has not
// rewritten yet (an earlier attempt's, pending) must not record them: the
// rebuild drops that withdrawal and the units come back into stock.
func TestDecreaseDoesNotCountWithdrawalsARebuildDrops(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(100), withShards(4))
	ctx := context.Background()
	camp, err := f.l.GetCampaign(ctx, f.cfg.CampaignID)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.e.Store().Withdraw(ctx, 0, camp.Epoch, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := f.l.BeginRebuild(ctx, f.cfg.CampaignID, 0); err != nil {
		t.Fatal(err)
	}
	// Shards 1–3 already rewritten by the rebuild; shard 0 waits its turn.
	for shard := 1; shard < 4; shard++ {
		if err := f.rdb.HSet(ctx, f.e.Store().Keys(shard).Meta(), "epoch", camp.Epoch+1).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.e.ApplyAllocation(ctx, 80); !errors.Is(err, stock.ErrRebuilt) {
		t.Fatalf("a decrease counting a withdrawal the rebuild drops: %v, want ErrRebuilt", err)
	}
	if c, err := f.l.GetCampaign(ctx, f.cfg.CampaignID); err != nil || c.Allocation != 100 {
		t.Fatalf("ledger allocation %d (%v), want 100: nothing recorded", c.Allocation, err)
	}
}

func TestRestockExactlyOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(10), withShards(3))
		ctx := context.Background()
		reserveMany(t, f, "r", 4)
		for range 3 {
			if _, err := f.e.ApplyAllocation(ctx, 510); err != nil {
				t.Fatal(err)
			}
		}
		c := f.assertConserved()
		if c.Allocation != 510 || c.Available != 506 {
			t.Fatalf("counts %+v", c)
		}
		// A change recorded in the ledger but not yet applied to Redis (a crash in
		// between) is finished by the next call, once.
		if _, planned, err := f.l.PlanAllocationIncrease(ctx, f.cfg.CampaignID, 600); err != nil || !planned {
			t.Fatal(planned, err)
		}
		for range 2 {
			if _, err := f.e.ApplyAllocation(ctx, 600); err != nil {
				t.Fatal(err)
			}
		}
		c = f.assertConserved()
		if c.Allocation != 600 || c.Available != 596 {
			t.Fatalf("counts %+v", c)
		}
		// A rebuild after the change keeps it exactly once too.
		if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
			t.Fatal(err)
		}
		if _, err := f.e.ApplyAllocation(ctx, 600); err != nil {
			t.Fatal(err)
		}
		if c := f.assertConserved(); c.Available != 596 {
			t.Fatalf("counts after rebuild %+v", c)
		}
		if _, err := f.e.ApplyAllocation(ctx, 3); !errors.Is(err, engine.ErrBelowHeld) {
			t.Fatalf("a decrease below the 4 reserved units must be refused: %v", err)
		}
		if c := f.assertConserved(); c.Allocation != 600 || c.Available != 596 {
			t.Fatalf("a refused decrease changed something: %+v", c)
		}
	})
}

func TestDeleteKeepsLedger(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(10))
		ctx := context.Background()
		ids := reserveMany(t, f, "d", 3)
		if err := f.e.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := f.e.Store().State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			if s.Present || s.Available != 0 {
				t.Fatalf("shard %d still there: %+v", s.Index, s)
			}
		}
		if n, _ := f.e.Store().DeleteAll(ctx); n != 0 {
			t.Fatalf("%d keys left after delete", n)
		}
		// Retried (the operator's finalizer failed later on): nothing left
		// to scan for, and no SCAN sent.
		if c, ok := rdb.(*redis.Client); ok {
			scans := func() string {
				return infoField(t, c, "commandstats", "cmdstat_scan")
			}
			before := scans()
			if err := f.e.Delete(ctx); err != nil {
				t.Fatal(err)
			}
			if after := scans(); after != before {
				t.Fatalf("a retried delete scanned Redis again: %s → %s", before, after)
			}
		}
		for _, id := range ids {
			if s := orderStatus(t, f, id); s != ledger.StatusPending {
				t.Fatalf("ledger row %s: %s", id, s)
			}
		}
		c, err := f.l.GetCampaign(ctx, f.cfg.CampaignID)
		if err != nil || c.DeletedAt == nil {
			t.Fatalf("campaign %+v %v", c, err)
		}
	})
}

// A sale deleted before it was ever seeded (its ledger was unreachable the
// whole time) has nothing to clean: Delete succeeds, so the FlashSale's
// finalizer does not block its deletion forever.
func TestDeleteOfACampaignNeverCreated(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()))
	cfg := f.cfg
	cfg.CampaignID = "c-" + randomID()
	e := openEngine(t, cfg, f.rdb, f.l)
	if err := e.Delete(context.Background()); err != nil {
		t.Fatalf("delete of a campaign the ledger never had: %v", err)
	}
	if _, err := f.l.GetCampaign(context.Background(), cfg.CampaignID); !errors.Is(err, ledger.ErrCampaignNotFound) {
		t.Fatalf("Delete created the campaign: %v", err)
	}
}

// Lowering the allocation above what is sold and reserved removes units from the
// available stock, exactly once; below it is refused and changes nothing; while
// units are reserved it waits for them, holding what it withdrew out of stock.
func TestAllocationDecrease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(100), withShards(4), withTTL(shortTTL, 0))
		ctx := context.Background()
		ids := reserveMany(t, f, "x", 10)
		if _, err := f.e.Checkout(ctx, "x-0", ids[0], "pay"); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := f.e.ApplyAllocation(ctx, 60); err != nil {
				t.Fatal(err)
			}
		}
		c := f.assertConserved()
		if c.Allocation != 60 || c.Available != 50 || c.Withdrawn != 0 {
			t.Fatalf("after lowering to 60: %+v", c)
		}
		// Only 50 units are available: lowering to 15 needs 45, fine; to 5 is below
		// the 10 held units.
		if _, err := f.e.ApplyAllocation(ctx, 5); !errors.Is(err, engine.ErrBelowHeld) {
			t.Fatalf("below held: %v", err)
		}
		if c := f.assertConserved(); c.Allocation != 60 || c.Available != 50 {
			t.Fatalf("a refused decrease changed something: %+v", c)
		}
		// Lowering to 10 takes every available unit.
		_, err := f.e.ApplyAllocation(ctx, 10)
		if err != nil {
			t.Fatalf("lower to 10: %v", err)
		}
		if c := f.assertConserved(); c.Allocation != 10 || c.Available != 0 {
			t.Fatalf("after lowering to 10: %+v", c)
		}
		// A rebuild keeps the lowered allocation.
		if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
			t.Fatal(err)
		}
		if c := f.assertConserved(); c.Allocation != 10 || c.Available != 0 || c.Sold != 1 {
			t.Fatalf("after rebuild: %+v", c)
		}
		// Now the 9 pending expire: the stock comes back within the new allocation.
		time.Sleep(shortTTL + 100*time.Millisecond)
		f.sweepUntilQuiet()
		if c := f.assertConserved(); c.Allocation != 10 || c.Available != 9 {
			t.Fatalf("after expiry: %+v", c)
		}
	})
}

// A decrease that needs units held in Redis by reservations the ledger does not
// know (the API died before writing them) waits for the sweeper to release them,
// and keeps what it withdrew out of stock meanwhile.
func TestAllocationDecreasePending(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(20), withShards(2), withTTL(shortTTL, 0))
	ctx := context.Background()
	for i := range 10 {
		user := fmt.Sprintf("z-%d", i)
		home := stock.HomeShard(user, 2)
		r, err := f.e.Store().Reserve(ctx, stock.ReserveRequest{
			Shard: home, Home: home, Mode: stock.ModeHome, User: user, Quantity: 1, MaxPerUser: 1, TTL: shortTTL,
			Key: stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, "r"),
		})
		if err != nil || r.Code != stock.Reserved {
			t.Fatalf("%+v %v", r, err)
		}
	}
	_, err := f.e.ApplyAllocation(ctx, 5)
	if !errors.Is(err, engine.ErrAllocationPending) {
		t.Fatalf("want pending, got %v", err)
	}
	c := f.counts()
	if c.Allocation != 20 || c.Available != 0 || c.Withdrawn != 10 || !c.Conserved() {
		t.Fatalf("while pending: %+v", c)
	}
	if r := f.reserve("late-buyer", "r", 1); r.Outcome != engine.OutcomeSoldOut {
		t.Fatalf("withdrawn units must not be reservable: %s", r.Outcome)
	}
	time.Sleep(shortTTL + 100*time.Millisecond)
	if st := f.sweepUntilQuiet(); st.Abandoned != 10 {
		t.Fatalf("sweep %+v", st)
	}
	if _, err := f.e.ApplyAllocation(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if c := f.assertConserved(); c.Allocation != 5 || c.Available != 5 || c.Withdrawn != 0 {
		t.Fatalf("%+v", c)
	}
	// Raising again after a decrease adds exactly the difference.
	if _, err := f.e.ApplyAllocation(ctx, 8); err != nil {
		t.Fatal(err)
	}
	if c := f.assertConserved(); c.Allocation != 8 || c.Available != 8 {
		t.Fatalf("%+v", c)
	}
}

// TestAllocationDecreaseCrashedAfterRecording: the decrease's units were
// withdrawn and the decrease recorded in the ledger, then the process died (or
// Redis failed) before any shard settled it. Whatever the next call asks for,
// the same allocation again, a restock or a further decrease, the recorded
// decrease is settled first: the withdrawn units never go back into stock.
func TestAllocationDecreaseCrashedAfterRecording(t *testing.T) {
	for _, target := range []int64{80, 90, 70} {
		t.Run(strconv.FormatInt(target, 10), func(t *testing.T) {
			f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(100), withShards(4))
			ctx := context.Background()
			reserveMany(t, f, "held", 10)
			// What withdrawForDecrease does for 100 -> 80, up to the crash.
			camp, err := f.l.GetCampaign(ctx, f.cfg.CampaignID)
			if err != nil {
				t.Fatal(err)
			}
			for shard := range 4 {
				if moved, _, err := f.e.Store().Withdraw(ctx, shard, camp.Epoch, 5); err != nil || moved != 5 {
					t.Fatalf("withdraw from shard %d: %d %v", shard, moved, err)
				}
			}
			if _, err := f.l.RecordAllocationDecrease(ctx, f.cfg.CampaignID, camp.Epoch, 100, 80, []int64{-5, -5, -5, -5}); err != nil {
				t.Fatal(err)
			}

			if _, err := f.e.ApplyAllocation(ctx, target); err != nil {
				t.Fatal(err)
			}
			c := f.assertConserved()
			if c.Allocation != target || c.Withdrawn != 0 || c.Available != target-10 {
				t.Fatalf("after ApplyAllocation(%d): %+v", target, c)
			}
			for _, s := range c.Shards {
				if s.Withdrawn != 0 {
					t.Fatalf("shard %d has %d withdrawn units left", s.Index, s.Withdrawn)
				}
			}
			// Selling out takes exactly what the allocation leaves: 400 buyers
			// reach every shard many times over.
			sold := 0
			for i := range 400 {
				if r := f.reserve(fmt.Sprintf("buyer-%d", i), "r", 1); r.Outcome == engine.OutcomeReserved {
					sold++
				}
			}
			if int64(sold) != target-10 {
				t.Fatalf("%d more units reserved, the allocation %d leaves %d", sold, target, target-10)
			}
		})
	}
}

// TestConservedSeesEachShard: the sums can balance while one shard's counters
// are broken; Conserved must not be fooled by that.
func TestConservedSeesEachShard(t *testing.T) {
	ok := engine.Counts{Allocation: 80, Available: 68, Reserved: 10, Sold: 2, Shards: []engine.ShardCounts{
		{Index: 0, Available: 34, Reserved: 5, Sold: 1, Allocation: 40}, {Index: 1, Available: 34, Reserved: 5, Sold: 1, Allocation: 40},
	}}
	if !ok.Conserved() {
		t.Fatalf("%+v must be conserved", ok)
	}
	for name, c := range map[string]engine.Counts{
		// 20 units back in stock against a settled decrease (withdrawn -20).
		"withdrawn below zero": {Allocation: 80, Available: 90, Reserved: 10, Withdrawn: -20, Shards: []engine.ShardCounts{
			{Index: 0, Available: 45, Reserved: 5, Withdrawn: -10, Allocation: 40}, {Index: 1, Available: 45, Reserved: 5, Withdrawn: -10, Allocation: 40},
		}},
		"stock below zero": {Allocation: 80, Available: 70, Reserved: 10, Shards: []engine.ShardCounts{
			{Index: 0, Available: 75, Reserved: 5, Allocation: 40}, {Index: 1, Available: -5, Reserved: 5, Allocation: 40},
		}},
		// The last reservation of a shard released twice: stock up by two,
		// the reserved counter below zero; the sums still balance.
		"released twice": {Allocation: 80, Available: 7, Reserved: 3, Sold: 70, Shards: []engine.ShardCounts{
			{Index: 0, Available: 2, Reserved: -1, Sold: 39, Allocation: 40}, {Index: 1, Available: 5, Reserved: 4, Sold: 31, Allocation: 40},
		}},
		// One shard over its allocation, the other under by as much.
		"shards off in opposite ways": {Allocation: 80, Available: 70, Reserved: 10, Shards: []engine.ShardCounts{
			{Index: 0, Available: 45, Reserved: 5, Allocation: 40}, {Index: 1, Available: 25, Reserved: 5, Allocation: 40},
		}},
	} {
		if c.Conserved() {
			t.Errorf("%s: %+v must not be conserved", name, c)
		}
	}
}

// A ledger that does not know a sale Redis holds (its DSN now points at
// another database, or it lost data) is refused, and nothing is created in
// it: a second book at epoch 1 would let a later rebuild sell the sold units
// again. The same when the caller knows the sale was seeded before, even with
// Redis empty too.
func TestSeedRefusesALedgerThatDoesNotKnowTheSale(t *testing.T) {
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(10), withShards(2))
	reserveMany(t, f, "sold", 3)
	ctx := context.Background()
	other := func() (*engine.Engine, *ledger.Ledger) {
		l := newLedger(t, sharedPG)
		return openEngine(t, f.cfg, rdb, l), l
	}
	e, l := other()
	if _, err := e.Seed(ctx, stock.StateOpen); !errors.Is(err, engine.ErrLedgerMismatch) {
		t.Fatalf("seed on a ledger without the sale while Redis holds it: %v", err)
	}
	if _, err := l.GetCampaign(ctx, f.cfg.CampaignID); !errors.Is(err, ledger.ErrCampaignNotFound) {
		t.Fatalf("the other ledger got the campaign: %v", err)
	}
	if c := f.counts(); c.Reserved != 3 || c.Available != 7 {
		t.Fatalf("Redis changed: %+v", c)
	}

	empty := testharness.RedisT(t)
	f.cfg.CampaignID = "c-" + randomID()
	e, _ = other()
	e2 := openEngine(t, f.cfg, standaloneClient(t, empty.Addr()), l)
	if _, err := e2.SeedSale(ctx, stock.StateOpen, true); !errors.Is(err, engine.ErrLedgerMismatch) {
		t.Fatalf("seed of a sale seeded before, on an empty Redis and ledger: %v", err)
	}
	if res, err := e.SeedSale(ctx, stock.StateOpen, false); err != nil || res.Seeded != 2 {
		t.Fatalf("a new sale: %+v %v", res, err)
	}
}

// TestSeedAfterLossIsARebuild: Redis lost a campaign's keys without restarting
// (a FLUSHALL, an eviction) while a reservation's ledger row was on its way.
// Seeding afresh at the same epoch would let that row commit against a full
// stock again; Seed refuses, and the rebuild counts the row.
func TestSeedAfterLossIsARebuild(t *testing.T) {
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(1), withShards(1))
	ctx := context.Background()
	// Hold the row: the group-commit statement share-locks the campaign row.
	tx, err := f.l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE`, f.cfg.CampaignID); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		r   engine.ReserveResult
		err error
	}
	first := make(chan answer, 1)
	go func() {
		r, err := f.e.Reserve(ctx, "first", "r", 1)
		first <- answer{r, err}
	}()
	testharness.Eventually(t, 5*time.Second, "the unit taken in Redis", func() bool { return f.counts().Reserved == 1 })

	keys, err := rdb.Keys(ctx, stock.ShardKeys(f.cfg.CampaignID, 0).Pattern()).Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("campaign keys %v: %v", keys, err)
	}
	if err := rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.Seed(ctx, stock.StateOpen); !errors.Is(err, engine.ErrNeedsRebuild) {
		t.Fatalf("seed after the loss must refuse: %v", err)
	}

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-first; a.err != nil || a.r.Outcome != engine.OutcomeReserved {
		t.Fatalf("the reservation in flight: %+v %v", a.r, a.err)
	}
	if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
		t.Fatal(err)
	}
	if r := f.reserve("second", "r", 1); r.Outcome != engine.OutcomeSoldOut {
		t.Fatalf("the only unit is reserved, a second buyer got %s", r.Outcome)
	}
	if c := f.assertConserved(); c.Reserved != 1 || c.Available != 0 {
		t.Fatalf("after the rebuild: %+v", c)
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
			if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
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
	if _, err := f.e.SeedSale(ctx, stock.StateOpen, true); !errors.Is(err, engine.ErrNeedsRebuild) {
		t.Fatalf("seeding over shards left being rebuilt: %v, want ErrNeedsRebuild", err)
	}
	if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
		t.Fatal(err)
	}
	if c := f.assertConserved(); c.Available != 9 || c.Reserved != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// TestOvertakenRebuildWritesNothing: two rebuilds of one shard overlap (two
// managers that both believed they led). Once the newer one has begun, the
// older one's reservations, quota fields and meta are refused, so nothing
// from its older ledger snapshot lands in the newer rebuild.
func TestOvertakenRebuildWritesNothing(t *testing.T) {
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(10), withShards(1))
	ctx := context.Background()
	s := f.e.Store()
	old := stock.Reservation{Key: "old-snapshot", User: "ann", Quantity: 1, Status: stock.ResReserved,
		ExpiryMs: time.Now().Add(time.Minute).UnixMilli(), Epoch: 1, Home: 0}
	if err := s.RebuildBegin(ctx, 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := s.RebuildBegin(ctx, 0, 6); err != nil {
		t.Fatal(err)
	}
	if err := s.RebuildRestore(ctx, 0, 5, []stock.Reservation{old}); err == nil {
		t.Fatal("the overtaken rebuild restored a reservation")
	}
	if err := s.RebuildUsers(ctx, 0, 5, []string{"ann", "1"}); err == nil {
		t.Fatal("the overtaken rebuild restored a quota")
	}
	if err := s.RebuildFinish(ctx, 0, 10, 5, stock.StateOpen, 10, 0); err == nil {
		t.Fatal("the overtaken rebuild opened the shard")
	}
	if n, err := rdb.Exists(ctx, s.Keys(0).Res(old.Key), s.Keys(0).Users()).Result(); err != nil || n != 0 {
		t.Fatalf("%d keys of the overtaken rebuild exist (%v)", n, err)
	}
	// The newer rebuild's own steps go through.
	if err := s.RebuildRestore(ctx, 0, 6, []stock.Reservation{old}); err != nil {
		t.Fatal(err)
	}
	if err := s.RebuildUsers(ctx, 0, 6, []string{"ann", "1"}); err != nil {
		t.Fatal(err)
	}
	// A real rebuild puts the shard back as the ledger has it.
	if _, err := f.e.Rebuild(ctx, gate(stock.StateOpen)); err != nil {
		t.Fatal(err)
	}
	if c := f.assertConserved(); c.Available != 10 || c.Reserved != 0 {
		t.Fatalf("after the rebuild: %+v", c)
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

// A Redis that may evict keys (maxmemory with a policy other than noeviction)
// gets nothing seeded or rebuilt: not the shards, not the ledger campaign,
// not a new epoch. Without maxmemory, no policy evicts.
func TestRedisThatMayEvictIsRefused(t *testing.T) {
	srv, err := testharness.StartRedisArgs("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	rdb := standaloneClient(t, srv.Addr())
	ctx := context.Background()
	l := newLedger(t, sharedPG)
	cfg := engine.Config{
		CampaignID: "c-" + randomID(), Namespace: "shop", Name: "drop", SKU: "itm-ps5-pro",
		Allocation: 100, Shards: 4, MaxPerUser: 1, TTL: time.Minute, StealProbes: 2,
		IDSecret: []byte("0123456789abcdef0123456789abcdef"),
	}
	e := openEngine(t, cfg, rdb, l)
	_, err = e.SeedSale(ctx, stock.StateOpen, false)
	if !errors.Is(err, stock.ErrEvictionPolicy) || !strings.Contains(err.Error(), "allkeys-lru") || !strings.Contains(err.Error(), srv.Addr()) {
		t.Fatalf("seed on an evicting Redis: %v", err)
	}
	if n, _ := rdb.DBSize(ctx).Result(); n != 0 {
		t.Fatalf("%d keys written", n)
	}
	if _, err := l.GetCampaign(ctx, cfg.CampaignID); !errors.Is(err, ledger.ErrCampaignNotFound) {
		t.Fatalf("ledger campaign created: %v", err)
	}

	config := func(k, v string) {
		t.Helper()
		if err := rdb.ConfigSet(ctx, k, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	config("maxmemory-policy", "noeviction")
	if _, err := e.SeedSale(ctx, stock.StateOpen, false); err != nil {
		t.Fatalf("seed with noeviction: %v", err)
	}
	config("maxmemory-policy", "volatile-lru")
	if err := e.Store().CheckEviction(ctx); !errors.Is(err, stock.ErrEvictionPolicy) {
		t.Fatalf("volatile-lru: %v", err)
	}
	// A live sale that lost a shard there (evicted, or a master restarted
	// empty) must still fail closed, not stop at the policy.
	if err := rdb.Del(ctx, e.Store().Keys(2).Meta()).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.SeedSale(ctx, stock.StateOpen, true); !errors.Is(err, engine.ErrNeedsRebuild) {
		t.Fatalf("a live sale with a shard lost on an evicting Redis: %v, want ErrNeedsRebuild", err)
	}
	if _, err := e.Rebuild(ctx, gate(stock.StateOpen)); !errors.Is(err, stock.ErrEvictionPolicy) {
		t.Fatalf("rebuild on an evicting Redis: %v", err)
	}
	if c, err := l.GetCampaign(ctx, cfg.CampaignID); err != nil || c.Epoch != 1 {
		t.Fatalf("campaign after a refused rebuild: %+v, %v", c, err)
	}
	config("maxmemory", "0")
	if err := e.Store().CheckEviction(ctx); err != nil {
		t.Fatalf("no maxmemory: %v", err)
	}
}

// Deleting a sale on a shared Redis removes all of its keys, page after page
// of SCAN, and none of anyone else's: here another sale's and 5,000 keys of
// other applications.
func TestDeleteOnASharedRedis(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		f := newFixture(t, rdb, withAllocation(3000), withMaxPerUser(1))
		other := newFixture(t, rdb, withAllocation(10))
		reserveMany(t, other, "o", 3)
		for i := range 2500 {
			if r := f.reserve(fmt.Sprintf("u%d", i), "r", 1); r.Outcome != engine.OutcomeReserved {
				t.Fatalf("reserve %d: %v", i, r.Outcome)
			}
		}
		prefix := "app-" + randomID() + ":"
		for i := 0; i < 5000; i += 500 {
			pipe := rdb.Pipeline()
			for j := i; j < i+500; j++ {
				pipe.Set(ctx, fmt.Sprintf("%s%d", prefix, j), "x", time.Hour)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		n, err := f.e.Store().DeleteAll(ctx)
		if err != nil || n < 2500 {
			t.Fatalf("DeleteAll: %d keys, %v", n, err)
		}
		if n, _ := f.e.Store().DeleteAll(ctx); n != 0 {
			t.Fatalf("%d keys left", n)
		}
		for i := 0; i < 5000; i += 997 {
			if v, err := rdb.Get(ctx, fmt.Sprintf("%s%d", prefix, i)).Result(); err != nil || v != "x" {
				t.Fatalf("another application's key %d: %q %v", i, v, err)
			}
		}
		if c, err := other.e.Counts(ctx); err != nil || c.Reserved != 3 || c.Available != 7 {
			t.Fatalf("the other sale: %+v %v", c, err)
		}
	})
}

// infoField is one line's value of a Redis INFO section.
func infoField(t *testing.T, c *redis.Client, section, field string) string {
	t.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
