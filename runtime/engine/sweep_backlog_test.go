package engine_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A pass sweeps at most its budget of batches on a shard, then goes on to the
// next shards: a backlog on the first shards (taken in index order, four at
// a time) no longer keeps the others' expired units waiting until it drains,
// nor past a pass cut at its time limit. Here shards 0-3 hold five batches of
// expired reservations each and shard 4 one reservation, the budget is one
// batch, and the pass is cut after its fifth batch: shard 4 was swept. Before
// the budget, shard 4 started only once one of the first four had drained,
// after the cut.
func TestSweepPassVisitsEveryShard(t *testing.T) {
	const shards, perShard = 5, 5 * engine.SweepBatch
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(shards*perShard), withShards(shards),
		withSteal(0), withTTL(shortTTL, 0))
	var users []string
	counts := make([]int, shards)
	for i := 0; len(users) < 4*perShard+1; i++ {
		u := fmt.Sprintf("b-%d", i)
		if h := stock.HomeShard(u, shards); h < 4 && counts[h] < perShard || h == 4 && counts[h] == 0 {
			counts[h]++
			users = append(users, u)
		}
	}
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(users)); i = next.Add(1) - 1 {
				if r, err := f.e.Reserve(context.Background(), users[i], "r", 1); err != nil || r.Outcome != engine.OutcomeReserved {
					t.Errorf("reserve %s: %+v %v", users[i], r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	time.Sleep(shortTTL + 200*time.Millisecond) // every reservation expired
	f.e.SetSweepBudget(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var batches atomic.Int64
	f.e.SetSweptBatch(func() {
		if batches.Add(1) == 5 {
			cancel() // the pass's time limit, after its fifth batch
		}
	})
	st, _ := f.e.Sweep(ctx)
	if held := f.counts().Shards[4].Reserved; held != 0 {
		t.Fatalf("shard 4 still holds %d expired units after a pass cut at its fifth batch (%+v)", held, st)
	}
	f.e.SetSweptBatch(nil)
	for range 10 {
		st, err := f.e.Sweep(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog == 0 {
			break
		}
	}
	if c := f.assertConserved(); c.Reserved != 0 {
		t.Fatalf("after the passes: %+v", c)
	}
}
