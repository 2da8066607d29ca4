package engine_test

import (
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// The shards a steal probes are drawn from Config.Rand: two engines with
// sources seeded alike steal in the same order (a chaos seed replays its
// steals), and the engine draws from nothing else.
func TestStealOrderFollowsItsSource(t *testing.T) {
	landings := func(seed uint64) []int {
		f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(40), withShards(4), withSteal(1), withMaxPerUser(1),
			withRand(mrand.NewPCG(seed, 1)))
		f.sellOutShard(0)
		var out []int
		for i := range 12 {
			r := f.reserve(userHomedOn(fmt.Sprintf("thief%d", i), 0, 4), "r", 1)
			if r.Outcome != engine.OutcomeReserved || r.Reservation.Shard == 0 {
				t.Fatalf("steal %d: %+v", i, r)
			}
			out = append(out, r.Reservation.Shard)
		}
		return out
	}
	a, b := landings(7), landings(7)
	if !slices.Equal(a, b) {
		t.Fatalf("the same seed stole in another order: %v and %v", a, b)
	}
	if c := landings(8); slices.Equal(a, c) {
		t.Fatalf("another seed stole in the same order: %v", c)
	}
}
