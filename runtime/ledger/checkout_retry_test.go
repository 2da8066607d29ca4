package ledger

import (
	"context"
	"testing"
	"time"
)

// A retried checkout whose first attempt started before the expiry and is
// still committing (a lock wait, a slow commit: here its transaction is held
// open) answers as that attempt's commit says. It used to read the row
// PENDING and expired, record the payment as late and answer "expired, void
// it", while the first attempt then committed the order with that payment.
func TestCheckoutRetryWaitsForTheFirstAttempt(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 1)
	o := insertOrder(t, l, pendingOrder(c, "bob", 0, 0), 300*time.Millisecond)

	first, err := l.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Rollback(context.Background()) })
	if tag, err := first.Exec(ctx, sqlCheckout, o.ReservationID, c.ID, "bob", "pay-1"); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("the first attempt's update: %v %v", tag, err)
	}
	for expired := false; !expired; time.Sleep(20 * time.Millisecond) {
		if err := l.pool.QueryRow(ctx, `SELECT expires_at <= now() FROM flashsale_orders WHERE reservation_id = $1`, o.ReservationID).Scan(&expired); err != nil {
			t.Fatal(err)
		}
	}

	type answer struct {
		got CheckoutOutcome
		err error
	}
	retried := make(chan answer, 1)
	go func() {
		got, _, err := l.Checkout(ctx, c.ID, o.ReservationID, "bob", "pay-1")
		retried <- answer{got, err}
	}()
	// The retry either answered already (it did not wait) or waits for the
	// first attempt's row lock.
	var early *answer
	for waiting := false; !waiting && early == nil; time.Sleep(20 * time.Millisecond) {
		select {
		case a := <-retried:
			early = &a
		default:
			if err := l.pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FOR SHARE%'`).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := early
	if a == nil {
		got := <-retried
		a = &got
	}
	if a.err != nil || a.got != CheckoutAlreadyCommitted {
		t.Fatalf("the retry answered %v, %v (late payments %v); the first attempt committed the order with the same payment: want already committed",
			a.got, a.err, latePayments(t, l, o.ReservationID))
	}
	if lp := latePayments(t, l, o.ReservationID); len(lp) != 0 {
		t.Fatalf("the paid order's payment recorded as late: %v", lp)
	}
	mustStatus(t, l, o.ReservationID, StatusCommitted)
}
