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
	waitExpired(t, l, o.ReservationID)

	// The retry either answers at once (it did not wait) or waits for the
	// first attempt's row lock.
	retry := startCheckout(ctx, l, c, o.ReservationID)
	retry.queued(t, l, 1)
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a := retry.answer(); a.err != nil || a.got != CheckoutAlreadyCommitted {
		t.Fatalf("the retry answered %v, %v (late payments %v); the first attempt committed the order with the same payment: want already committed",
			a.got, a.err, latePayments(t, l, o.ReservationID))
	}
	if lp := latePayments(t, l, o.ReservationID); len(lp) != 0 {
		t.Fatalf("the paid order's payment recorded as late: %v", lp)
	}
	mustStatus(t, l, o.ReservationID, StatusCommitted)
}

// The same when the first attempt waits behind a reader's share lock on the
// row (a report, or any FOR SHARE) and reaches the row only after the expiry:
// the retry does not jump ahead of it, and it does not commit a payment its
// retry was told to void. Whichever gets the row first, both answers agree
// with the row.
func TestCheckoutRetryAndItsFirstAttemptAgreeBehindAShareLock(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 1)
	o := insertOrder(t, l, pendingOrder(c, "bob", 0, 0), 500*time.Millisecond)

	reader, err := l.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Rollback(context.Background()) })
	if _, err := reader.Exec(ctx, `SELECT 1 FROM flashsale_orders WHERE reservation_id = $1 FOR SHARE`, o.ReservationID); err != nil {
		t.Fatal(err)
	}
	first := startCheckout(ctx, l, c, o.ReservationID)
	for lockWaits(t, l) < 1 {
		time.Sleep(10 * time.Millisecond)
	}
	waitExpired(t, l, o.ReservationID)
	// The retry answers at once only if it jumped the queue; else it waits too.
	retry := startCheckout(ctx, l, c, o.ReservationID)
	retry.queued(t, l, 2)
	if err := reader.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a, r := first.answer(), retry.answer()
	row, err := l.GetOrder(ctx, c.ID, o.ReservationID)
	if err != nil {
		t.Fatal(err)
	}
	late := latePayments(t, l, o.ReservationID)
	t.Logf("first attempt %v %v, retry %v %v, row %s, late payments %v", a.got, a.err, r.got, r.err, row.Status, late)
	if a.err != nil || r.err != nil {
		t.Fatalf("errors: %v, %v", a.err, r.err)
	}
	if row.Status == StatusCommitted && (r.got == CheckoutExpired || a.got == CheckoutExpired || len(late) != 0) {
		t.Fatalf("the order is paid with pay-1, and an answer says to void it: first %v, retry %v, late payments %v", a.got, r.got, late)
	}
	if row.Status == StatusPending && (a.got != CheckoutExpired || r.got != CheckoutExpired) {
		t.Fatalf("the order is not paid, and an answer says it is: first %v, retry %v", a.got, r.got)
	}
}

// checkoutRun is bob's checkout of a reservation with pay-1, running in the
// background.
type checkoutRun struct {
	ch    chan checkoutAnswer
	early *checkoutAnswer // answered while queued was waiting
}

type checkoutAnswer struct {
	got CheckoutOutcome
	err error
}

func startCheckout(ctx context.Context, l *Ledger, c Campaign, id string) *checkoutRun {
	r := &checkoutRun{ch: make(chan checkoutAnswer, 1)}
	go func() {
		got, _, err := l.Checkout(ctx, c.ID, id, "bob", "pay-1")
		r.ch <- checkoutAnswer{got, err}
	}()
	return r
}

// queued waits until the checkout has answered, or waits for a lock with
// n sessions of the test's database waiting in all.
func (r *checkoutRun) queued(t *testing.T, l *Ledger, n int) {
	t.Helper()
	for r.early == nil && lockWaits(t, l) < n {
		select {
		case a := <-r.ch:
			r.early = &a
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (r *checkoutRun) answer() checkoutAnswer {
	if r.early != nil {
		return *r.early
	}
	return <-r.ch
}

// lockWaits counts the sessions of the test's database waiting for a lock.
func lockWaits(t *testing.T, l *Ledger) (n int) {
	t.Helper()
	if err := l.pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitExpired waits until the order's expiry has passed by the database clock.
func waitExpired(t *testing.T, l *Ledger, id string) {
	t.Helper()
	for expired := false; !expired; time.Sleep(20 * time.Millisecond) {
		if err := l.pool.QueryRow(testCtx(t), `SELECT expires_at <= clock_timestamp() FROM flashsale_orders WHERE reservation_id = $1`, id).Scan(&expired); err != nil {
			t.Fatal(err)
		}
	}
}
