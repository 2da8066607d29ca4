package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A request whose ledger row was never sent gives back the reservation it
// placed, not the one a retry of the same request placed since under the same
// key and was answered "reserved" for. Here the first attempt's row waits in a
// batch while Redis loses its data and the sale is rebuilt (the row is not in
// the ledger, so the rebuild does not restore it); the client retries on
// another pod and gets a 201; then the first attempt's deadline passes. Its
// give-back used to delete the retry's reservation and put the unit back in
// stock, for another buyer to take and pay for too.
func TestAGiveBackLeavesTheRetrysReservation(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := standaloneClient(t, r.Addr())
	f := newFixture(t, rdb, withAllocation(1), withShards(1), withMaxPerUser(1), withSteal(0))
	ctx := context.Background()

	// The first pod: its batch lingers until the test lets the request go.
	first, err := engine.New(f.cfg, rdb, f.l, ledger.MaterializerConfig{MaxWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.Close)
	rctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	type answer struct {
		res engine.ReserveResult
		err error
	}
	firstDone := make(chan answer, 1)
	go func() {
		res, err := first.Reserve(rctx, "buyer", "req-1", 1)
		firstDone <- answer{res, err}
	}()
	testharness.Eventually(t, 10*time.Second, "the first attempt's unit taken in Redis", func() bool {
		c, err := f.e.Counts(ctx)
		return err == nil && c.Available == 0
	})

	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 30*time.Second, "Redis back", func() bool { return f.e.Store().Ping(ctx) == nil })
	if _, err := f.e.Rebuild(ctx, openGate); err != nil {
		t.Fatal(err)
	}
	retry := f.reserve("buyer", "req-1", 1)
	if retry.Outcome != engine.OutcomeReserved {
		t.Fatalf("the retry on another pod: %+v, want reserved", retry)
	}

	giveUp()
	got := <-firstDone
	if !errors.Is(got.err, engine.ErrUnavailable) {
		t.Fatalf("the first attempt: %+v, %v; want unavailable (its row not sent)", got.res, got.err)
	}
	_, key, err := stock.ParseID(retry.Reservation.ID, f.cfg.Shards)
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := f.e.Store().GetReservation(ctx, retry.Reservation.Shard, key); err != nil || !found {
		t.Fatalf("the retry's acknowledged reservation %s is gone from Redis (found %v, %v)", retry.Reservation.ID, found, err)
	}
	if other := f.reserve("other", "req-2", 1); other.Outcome == engine.OutcomeReserved {
		t.Fatalf("another buyer took the unit reserved for the retry: %+v", other)
	}
	if _, err := f.e.Checkout(ctx, "buyer", retry.Reservation.ID, "pay-1"); err != nil {
		t.Fatal(err)
	}
	f.assertConserved()
}
