package api

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A checkout whose ledger answer does not come in time may have committed
// (the commit landed, its answer was lost): the 503 must not read as
// "nothing happened", or a shop would void a payment whose unit is sold. It
// says to retry with the same payment_token, which answers as the first
// did.
func TestACheckoutWithoutAnAnswerSaysThePaymentMayBeRecorded(t *testing.T) {
	f := newFixture(t, withAllocation(10), func(c *fixtureConfig) { c.api.RequestTimeout = 300 * time.Millisecond })
	held := f.reserve("ann", "k", 1)
	ctx := context.Background()
	tx, err := f.l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM flashsale_orders WHERE reservation_id = $1 FOR UPDATE`, held.ReservationID); err != nil {
		t.Fatal(err)
	}
	co := f.checkout("ann", held.ReservationID, "pay-1")
	e := co.errorBody(t)
	if co.status != http.StatusServiceUnavailable || e.Code != CodeUnavailable ||
		!strings.Contains(e.Message, "retry with the same payment_token") || !strings.Contains(e.Message, "void it only on a 409, 410 or 404") {
		t.Fatalf("checkout without the ledger's answer: %d %+v", co.status, e)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if again := f.checkout("ann", held.ReservationID, "pay-1"); again.status != http.StatusOK {
		t.Fatalf("the checkout's retry: %d %s", again.status, again.body)
	}
}
