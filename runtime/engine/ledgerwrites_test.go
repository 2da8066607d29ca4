package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// noUnitTakenFor reserves once every 100 ms for d and fails the test if
// any call ran the reserve script: while the ledger cannot write, a unit
// taken is only given back, or held until it expires, and meanwhile other
// buyers may be told SOLD_OUT.
func noUnitTakenFor(t *testing.T, f *fixture, d time.Duration, why string) {
	t.Helper()
	ctx := context.Background()
	for i, start := 0, time.Now(); time.Since(start) < d; i++ {
		r, err := f.e.Reserve(ctx, fmt.Sprintf("later-%d", i), "r", 1)
		if !errors.Is(err, engine.ErrUnavailable) || r.Calls != 0 {
			t.Fatalf("reserve %d %s: %+v %v, want unavailable with no script call", i, why, r, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A ledger that answers reads but refuses every write (a primary demoted in
// a switchover, default_transaction_read_only): once one write was refused,
// reservations take no unit until a writer's probe passes. A ping of the
// ledger passes on such a server, and let a wave through every 250 ms.
func TestALedgerThatTakesNoWritesTakesNoUnits(t *testing.T) {
	pg := testharness.PostgresT(t)
	f := newFixtureOn(t, standaloneClient(t, sharedRedis.Addr()), pg, withAllocation(10))
	ctx := context.Background()
	if r := f.reserve("first", "r", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatal(r.Outcome)
	}
	readOnlyServer(t, pg, true)
	r, err := f.e.Reserve(ctx, "refused", "r", 1)
	if !errors.Is(err, engine.ErrUnavailable) || r.Calls != 1 {
		t.Fatalf("the first reserve on a read-only ledger: %+v %v, want unavailable after its script call", r, err)
	}
	noUnitTakenFor(t, f, 1500*time.Millisecond, "while the ledger takes no writes")

	readOnlyServer(t, pg, false)
	testharness.Eventually(t, 15*time.Second, "a reservation once the ledger writes again", func() bool {
		_, err := f.e.Reserve(ctx, "back", "r", 1)
		return err == nil
	})
	if c := f.assertConserved(); c.Reserved != 2 {
		t.Fatalf("after the ledger took writes again: %+v, want 2 reserved", c)
	}
}

// A write that hangs longer than a batch's time (a lock on the orders table
// held past it): the batch's units are "outcome unknown" and held until
// they expire; the reservations after it take no unit while the lock is
// held, though the ledger answers a ping all along.
func TestALedgerHangLongerThanABatchTakesNoMoreUnits(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(10),
		withMaterializer(ledger.MaterializerConfig{Timeout: time.Second}))
	ctx := context.Background()
	if r := f.reserve("first", "r", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatal(r.Outcome)
	}
	tx, err := f.l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE flashsale_orders IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	r, err := f.e.Reserve(ctx, "hung", "r", 1)
	if !errors.Is(err, engine.ErrUnavailable) || r.Calls != 1 {
		t.Fatalf("the reserve whose batch timed out: %+v %v", r, err)
	}
	noUnitTakenFor(t, f, 2500*time.Millisecond, "while the orders table is locked")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 15*time.Second, "a reservation once the lock is gone", func() bool {
		_, err := f.e.Reserve(ctx, "back", "r", 1)
		return err == nil
	})
}

func readOnlyServer(t *testing.T, pg *testharness.Postgres, on bool) {
	t.Helper()
	if err := pg.SetReadOnly(on); err != nil {
		t.Fatal(err)
	}
}
