package ledger

import (
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
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
	shift := testharness.SkewClock(ctx, t, dsn)
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
