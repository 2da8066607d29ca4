package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A payment answered "expired, void it" is never committed afterwards, even
// when PostgreSQL's clock steps back (an NTP step, a failover to a primary
// whose clock is behind) and the row, still PENDING until the sweeper's grace
// runs out, reads as unexpired again: the retry of that payment is answered
// "expired" as before. Before, it committed the order with the payment the
// late-payments table says to void. A new payment may still take the
// reservation while the (stepped-back) clock says it is valid.
func TestAPaymentToldExpiredNeverCommitsWhenTheClockStepsBack(t *testing.T) {
	t.Parallel()
	dsn := newDSN(t, testPG)
	ctx := testCtx(t)
	shift := skewClock(ctx, t, dsn)
	l := openLedger(t, dsn)
	c := newCampaign(t, l, 100, 1)
	o := insertOrder(t, l, pendingOrder(c, "bob", 0, 0), 5*time.Second)

	shift("10 seconds") // the database's clock 5 s past the expiry
	if out, _, err := l.Checkout(ctx, c.ID, o.ReservationID, "bob", "pay-1"); err != nil || out != CheckoutExpired {
		t.Fatalf("the first attempt: %v, %v; want expired", out, err)
	}
	shift("0") // stepped back: the row is valid again by the clock

	out, got, err := l.Checkout(ctx, c.ID, o.ReservationID, "bob", "pay-1")
	if err != nil || out != CheckoutExpired {
		t.Fatalf("the retry of the payment told to void: %v (order %s, paid with %q), %v; want expired again (late payments %v)",
			out, got.Status, got.PaymentToken, err, latePayments(t, l, o.ReservationID))
	}
	if row, err := l.GetOrder(ctx, c.ID, o.ReservationID); err != nil || row.Status != StatusPending {
		t.Fatalf("the order is %s after the retry (%v), want PENDING", row.Status, err)
	}
	if out, got, err := l.Checkout(ctx, c.ID, o.ReservationID, "bob", "pay-2"); err != nil || out != CheckoutCommitted || got.PaymentToken != "pay-2" {
		t.Fatalf("a new payment while the clock says valid: %v (%q), %v; want committed with pay-2", out, got.PaymentToken, err)
	}
}

// skewClock shadows now() and clock_timestamp() in dsn's database with
// functions that add an offset, through the database's search_path (set
// before the ledger connects), and returns what sets the offset, an interval.
func skewClock(ctx context.Context, t *testing.T, dsn string) func(string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, q := range []string{
		`CREATE SCHEMA skew`,
		`CREATE TABLE skew.offset_by (d interval NOT NULL)`,
		`INSERT INTO skew.offset_by VALUES ('0')`,
		`CREATE FUNCTION skew.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE
		 AS $$ SELECT pg_catalog.clock_timestamp() + (SELECT d FROM skew.offset_by) $$`,
		`CREATE FUNCTION skew.now() RETURNS timestamptz LANGUAGE sql STABLE
		 AS $$ SELECT pg_catalog.now() + (SELECT d FROM skew.offset_by) $$`,
		`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET search_path = public, skew, pg_catalog', current_database()); END $$`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return func(d string) {
		t.Helper()
		if _, err := conn.Exec(ctx, `UPDATE skew.offset_by SET d = $1::interval`, d); err != nil {
			t.Fatal(err)
		}
	}
}
