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

// perBuyerState is every shard's users hash and claims index.
func (f *fixture) perBuyerState() string {
	f.t.Helper()
	ctx := context.Background()
	out := ""
	for i := 0; i < f.cfg.Shards; i++ {
		k := f.e.Store().Keys(i)
		users, err := f.rdb.HGetAll(ctx, k.Users()).Result()
		if err != nil {
			f.t.Fatal(err)
		}
		claims, err := f.rdb.ZRange(ctx, k.Claims(), 0, -1).Result()
		if err != nil {
			f.t.Fatal(err)
		}
		out += fmt.Sprintf("shard %d: users %v claims %v\n", i, users, claims)
	}
	return out
}

// Break: per-buyer state was never deleted. Buyers refused SOLD_OUT leave
// nothing; a buyer whose reservation ends, on the home shard or stolen, is
// forgotten; a sold stolen reservation keeps its quota but not its pointer.
func TestPerBuyerStateGoesAtZero(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(4), withShards(2), withMaxPerUser(1))
		ctx := context.Background()
		empty := f.perBuyerState()
		// Each buyer cancels: home shard 0, then stolen from shard 1.
		for _, steal := range []bool{false, true} {
			if steal {
				f.sellOutShard(0)
				empty = f.perBuyerState()
			}
			u := userHomedOn(fmt.Sprintf("canceller-%v", steal), 0, 2)
			r := f.reserve(u, "r", 1)
			if r.Outcome != engine.OutcomeReserved || (r.Reservation.Shard == 1) != steal {
				t.Fatalf("reserve (steal %v): %+v", steal, r)
			}
			if c, err := f.e.Cancel(ctx, u, r.Reservation.ID); err != nil || c.Outcome != ledger.CancelCancelled {
				t.Fatalf("cancel: %v %v", c.Outcome, err)
			}
			if got := f.perBuyerState(); got != empty {
				t.Fatalf("after a cancel (steal %v):\n%s\nwant\n%s", steal, got, empty)
			}
		}
		// A sold stolen reservation: its quota stays, its pointer goes.
		buyer := userHomedOn("buyer", 0, 2)
		r := f.reserve(buyer, "r", 1)
		if r.Outcome != engine.OutcomeReserved || r.Reservation.Shard != 1 {
			t.Fatalf("reserve: %+v, want a stolen reservation", r)
		}
		if co, err := f.e.Checkout(ctx, buyer, r.Reservation.ID, "pay"); err != nil || co.Outcome != ledger.CheckoutCommitted {
			t.Fatalf("checkout: %v %v", co.Outcome, err)
		}
		users, err := rdb.HGetAll(ctx, f.e.Store().Keys(0).Users()).Result()
		if err != nil {
			t.Fatal(err)
		}
		key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, buyer, "r")
		if _, ok := users["p:"+key]; ok || users[buyer] != "1" {
			t.Fatalf("home shard after the sale of a stolen reservation: %v, want the buyer's count and no pointer", users)
		}
		if again := f.reserve(buyer, "r", 1); again.Outcome != engine.OutcomeReplayed || again.Reservation.ID != r.Reservation.ID {
			t.Fatalf("retry of the paid request: %+v", again)
		}
		// Sold out everywhere: refused buyers leave nothing.
		for f.counts().Available > 0 {
			f.sellOutShard(1)
		}
		before := f.perBuyerState()
		for i := range 50 {
			if r := f.reserve(fmt.Sprintf("late-%d", i), "r", 1); r.Outcome != engine.OutcomeSoldOut {
				t.Fatalf("late buyer: %s", r.Outcome)
			}
		}
		if after := f.perBuyerState(); after != before {
			t.Fatalf("refused buyers left state:\n%s\nwas\n%s", after, before)
		}
		f.assertQuotaCovers()
	})
}
