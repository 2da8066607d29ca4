package engine_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// A unit reserved and sold while Counts reads is counted once: read in the
// other order, the stock still held it when the ledger already sold it, and
// the counts said available + sold above the allocation (an oversell that
// never happened).
func TestCountsNeverSeeAUnitInStockAndSold(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(1), withShards(1))
		ctx := context.Background()
		var sold bool
		f.e.SetCountsBetweenReads(func() {
			f.e.SetCountsBetweenReads(nil)
			r := f.reserve("ida", "r1", 1)
			if r.Outcome != engine.OutcomeReserved {
				t.Errorf("reserve: %+v", r)
				return
			}
			co, err := f.e.Checkout(ctx, "ida", r.Reservation.ID, "pay")
			sold = err == nil && co.Outcome == ledger.CheckoutCommitted
			if !sold {
				t.Errorf("checkout: %+v, %v", co, err)
			}
		})
		c := f.counts()
		if !sold {
			t.Fatal("the unit was not sold between the reads")
		}
		if err := c.StockOversold(); err != nil {
			t.Fatalf("I1 reported for a unit sold once: %v (counts %+v)", err, c)
		}
		if c.Available+c.Sold+c.Unsold() > c.Allocation {
			t.Fatalf("status figures above the allocation: %+v", c)
		}
		// Read again, the sale is as it is: the unit sold, nothing in stock.
		c = f.assertConserved()
		if c.Sold != 1 || c.Available != 0 || c.Reserved != 0 {
			t.Fatalf("counts %+v", c)
		}
	})
}
