package engine_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// A buyer of two who finds no shard with two units is told SOLD_OUT, but a
// shard may still hold the last unit: a buyer of one right after must still
// be placed there, not skipped as a shard known to be empty.
func TestABuyerOfOneGetsTheUnitABuyerOfTwoCouldNot(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(4), withShards(2), withSteal(1), withMaxPerUser(2))
		f.sellOutShard(0)
		f.reserve(userHomedOn("filler", 1, 2), "r", 1)
		if got := f.counts().Shards[1].Available; got != 1 {
			t.Fatalf("shard 1 holds %d units, want 1", got)
		}

		if r := f.reserve(userHomedOn("pair", 0, 2), "r", 2); r.Outcome != engine.OutcomeSoldOut {
			t.Fatalf("a buyer of two with one unit left: %+v, want SOLD_OUT", r)
		}
		r := f.reserve(userHomedOn("single", 0, 2), "r", 1)
		if r.Outcome != engine.OutcomeReserved || r.Reservation.Shard != 1 {
			t.Fatalf("a buyer of one with one unit left on shard 1: %+v, want it reserved there", r)
		}
		f.assertNoOversell()
	})
}
