package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
	tx := lockOrders(t, f)
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

// lockOrders takes an exclusive lock on the orders table, so every ledger
// batch waits, until the test rolls the returned transaction back (or ends).
func lockOrders(t *testing.T, f *fixture) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := f.l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, "LOCK TABLE flashsale_orders IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	return tx
}

func readOnlyServer(t *testing.T, pg *testharness.Postgres, on bool) {
	t.Helper()
	if err := pg.SetReadOnly(on); err != nil {
		t.Fatal(err)
	}
}

// A batch that timed out behind a lock is "outcome unknown", and it may
// still commit once the lock goes (PostgreSQL does not notice the writer
// gone while it waits). Its buyer was answered 503 and its unit stayed held,
// so the late row and Redis agree: the buyer's retry with the same key is
// answered from that row, and at expiry the unit goes back once. The
// driver's cancel request on its way out would stop the statement if it
// landed before the lock went: the buyer's process reaches the ledger
// through a fault proxy that swallows it, so that the late commit comes
// every run.
func TestALateCommitAfterAnUnknownOutcomeSellsTheUnitOnce(t *testing.T) {
	const ttl = 3 * time.Second
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(10), withShards(1), withTTL(ttl, 0))
	ctx := context.Background()
	bl, proxy := f.ledgerThroughProxy("")
	buyers, err := engine.New(withTestPipeline(f.cfg), rdb, bl, ledger.MaterializerConfig{Timeout: time.Second, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(buyers.Close)
	// The writer's connection is open and its statement prepared: the
	// late one is sent, not stopped while it is prepared behind the lock.
	if r, err := buyers.Reserve(ctx, "first", "r", 1); err != nil || r.Outcome != engine.OutcomeReserved {
		t.Fatalf("first: %+v %v", r, err)
	}

	tx := lockOrders(t, f)
	type answer struct {
		r   engine.ReserveResult
		err error
	}
	late := make(chan answer, 1)
	go func() {
		r, err := buyers.Reserve(ctx, "late", "r", 1)
		late <- answer{r, err}
	}()
	testharness.Eventually(t, 10*time.Second, "the batch waiting on the lock", func() bool { return lockWaiters(t, f) >= 1 })
	if _, err := proxy.Timeout(testharness.Upstream, 0); err != nil {
		t.Fatal(err)
	}
	a := <-late
	if !errors.Is(a.err, engine.ErrUnavailable) || !strings.Contains(a.err.Error(), "outcome unknown") {
		t.Fatalf("the reserve whose batch timed out: %+v %v, want unavailable, outcome unknown", a.r, a.err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var id string
	testharness.Eventually(t, 15*time.Second, "the timed-out batch's row, committed once the lock went", func() bool {
		err := f.l.Pool().QueryRow(ctx, `SELECT reservation_id FROM flashsale_orders WHERE campaign_id = $1 AND user_id = 'late'`,
			f.cfg.CampaignID).Scan(&id)
		return err == nil
	})
	if c := f.assertConserved(); c.Reserved != 2 || c.Available != 8 {
		t.Fatalf("after the late commit: %+v, want 2 units held, 8 available", c)
	}

	// Once the ledger takes writes again, the retry is answered from the row.
	var again engine.ReserveResult
	testharness.Eventually(t, 15*time.Second, "the buyer's retry answered", func() bool {
		again, err = f.e.Reserve(ctx, "late", "r", 1)
		return err == nil
	})
	if again.Outcome != engine.OutcomeReplayed || again.Reservation.ID != id {
		t.Fatalf("the retry of the late reservation: %+v, want REPLAYED %s", again, id)
	}

	time.Sleep(ttl + 500*time.Millisecond)
	if st := f.sweepUntilQuiet(); st.Released != 2 {
		t.Fatalf("the sweep past expiry: %+v, want both reservations released once", st)
	}
	if c := f.assertConserved(); c.Reserved != 0 || c.Available != 10 || c.Sold != 0 {
		t.Fatalf("after the sweep: %+v, want all 10 units available again", c)
	}
}
