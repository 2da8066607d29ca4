package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// A payment and a cancel need the ledger only: a Redis that stalls (CLIENT
// PAUSE WRITE holds their scripts, and the client waits its read timeout,
// 3 s, whatever the request's deadline) neither spends the request's second
// before the ledger is asked nor holds the answer. Their marks reach Redis
// once it answers.
func TestAPaymentAndACancelDoNotWaitForAStalledRedis(t *testing.T) {
	r := testharness.RedisT(t)
	admin := standaloneClient(t, r.Addr())
	f := newFixture(t, standaloneClient(t, r.Addr()), withShards(1), withAllocation(5), withTTL(time.Hour, 0))
	ctx := context.Background()
	paid := f.reserve("pam", "r", 1).Reservation
	gone := f.reserve("cid", "r", 1).Reservation
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer unpause()
	rctx, cancel := context.WithTimeout(ctx, time.Second) // a request's deadline
	out, err := f.e.Checkout(rctx, "pam", paid.ID, "pay-1")
	cancel()
	if err != nil || out.Outcome != ledger.CheckoutCommitted {
		t.Fatalf("checkout with Redis stalled: %+v %v, want committed", out.Outcome, err)
	}
	rctx, cancel = context.WithTimeout(ctx, time.Second)
	c, err := f.e.Cancel(rctx, "cid", gone.ID)
	cancel()
	if err != nil || c.Outcome != ledger.CancelCancelled {
		t.Fatalf("cancel with Redis stalled: %+v %v, want cancelled", c.Outcome, err)
	}
	unpause()
	testharness.Eventually(t, 15*time.Second, "the marks in Redis", func() bool {
		states, err := f.e.Store().State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return states[0].Reserved == 0 && states[0].Available == 4
	})
	if c := f.assertConserved(); c.Sold != 1 {
		t.Fatalf("counts %+v, want 1 sold", c)
	}
	if again := f.reserve("cid", "again", 1); again.Outcome != engine.OutcomeReserved {
		t.Fatalf("cid after the cancel: %s, want the quota back", again.Outcome)
	}
}
