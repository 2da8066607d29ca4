package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A rebuild of more orders than one ledger batch and one script call, with
// stolen reservations and paid ones, puts back exactly what the ledger holds:
// the stock, the pending reservations (checkout-able, stolen ones with their
// pointers), and every buyer's units against the per-user limit, committed
// ones included although their hashes are not recreated.
func TestRebuildStreamsManyBatches(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const shards, perShard = 3, 450
		f := newFixture(t, rdb, withAllocation(shards*perShard), withShards(shards), withSteal(2), withMaxPerUser(1))
		ctx := context.Background()
		filled := f.sellOutShard(0)
		type held struct {
			user string
			r    engine.Reservation
		}
		var all []held
		stolen := 0
		for i := 0; len(all) < 1150-filled; i++ {
			u := fmt.Sprintf("buyer-%d", i)
			r := f.reserve(u, "r", 1)
			if r.Outcome != engine.OutcomeReserved {
				t.Fatalf("reserve %s: %s", u, r.Outcome)
			}
			if r.Reservation.Shard != stock.HomeShard(u, shards) {
				stolen++
			}
			all = append(all, held{u, r.Reservation})
		}
		if stolen < 100 {
			t.Fatalf("only %d stolen reservations: the test does not exercise pointers", stolen)
		}
		paid := map[string]bool{}
		for i, h := range all {
			if i%3 != 0 {
				continue
			}
			if co, err := f.e.Checkout(ctx, h.user, h.r.ID, "pay-"+h.user); err != nil || co.Outcome != ledger.CheckoutCommitted {
				t.Fatalf("checkout %s: %+v %v", h.r.ID, co, err)
			}
			paid[h.r.ID] = true
		}
		before := f.assertConserved()

		if _, err := f.e.Store().DeleteAll(ctx); err != nil {
			t.Fatal(err)
		}
		rep, err := f.e.Rebuild(ctx, gate(stock.StateOpen))
		if err != nil {
			t.Fatal(err)
		}
		pending := int64(filled + len(all) - len(paid))
		if rep.Restored != pending || rep.Holders != int64(filled+len(all)) || rep.Sold != int64(len(paid)) || rep.Reserved != pending {
			t.Fatalf("report %+v: want %d restored and reserved, %d buyers, %d sold", rep, pending, filled+len(all), len(paid))
		}
		after := f.assertConserved()
		if after.Available != before.Available || after.Sold != before.Sold || after.Reserved != before.Reserved {
			t.Fatalf("counts after the rebuild %+v, before the loss %+v", after, before)
		}
		if held := f.redisHeld(); sum(held) != pending {
			t.Fatalf("Redis holds %v reserved units, the ledger %d", held, pending)
		}

		for i, h := range all {
			if i%7 != 0 {
				continue
			}
			// The limit counts what the buyer holds, paid or not.
			if r := f.reserve(h.user, "another", 1); r.Outcome != engine.OutcomeLimit {
				t.Fatalf("%s (paid %v) reserved again after the rebuild: %s", h.user, paid[h.r.ID], r.Outcome)
			}
			// The same request replays, paid or not, stolen or not.
			if r := f.reserve(h.user, "r", 1); r.Outcome != engine.OutcomeReplayed || r.Reservation.ID != h.r.ID {
				t.Fatalf("%s retried after the rebuild: %+v, want REPLAYED %s", h.user, r, h.r.ID)
			}
		}
		// A stolen pending reservation is checked out on its shard after the
		// rebuild, and a cancelled one gives its buyer's quota back at home.
		var checked, cancelled bool
		for _, h := range all {
			if paid[h.r.ID] || h.r.Shard == stock.HomeShard(h.user, shards) {
				continue
			}
			switch {
			case !checked:
				if co, err := f.e.Checkout(ctx, h.user, h.r.ID, "pay-late"); err != nil || co.Outcome != ledger.CheckoutCommitted {
					t.Fatalf("checkout of stolen %s after the rebuild: %+v %v", h.r.ID, co, err)
				}
				checked = true
			case !cancelled:
				if cr, err := f.e.Cancel(ctx, h.user, h.r.ID); err != nil || cr.Outcome != ledger.CancelCancelled {
					t.Fatalf("cancel of stolen %s after the rebuild: %+v %v", h.r.ID, cr, err)
				}
				if r := f.reserve(h.user, "again", 1); r.Outcome != engine.OutcomeReserved {
					t.Fatalf("%s after cancelling a stolen reservation: %s", h.user, r.Outcome)
				}
				cancelled = true
			}
		}
		if !checked || !cancelled {
			t.Fatal("no stolen pending reservation to check out and cancel")
		}
		f.assertConserved()
	})
}

func sum(xs []int64) (n int64) {
	for _, x := range xs {
		n += x
	}
	return n
}
