package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

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
	tx := lockOrders(t, f)
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
