package engine_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// stormWorkers bounds live goroutines (the race detector allows 8128).
const stormWorkers = 400

// storm runs buyers users against the engine, each with one request, from many
// goroutines, and returns the acknowledged reservations. onResult may be nil.
func storm(t *testing.T, f *fixture, buyers int, prefix string, onResult func(engine.ReserveResult, error)) []engine.Reservation {
	t.Helper()
	var (
		mu    sync.Mutex
		acked []engine.Reservation
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	for range stormWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(buyers) {
					return
				}
				r, err := f.e.Reserve(context.Background(), fmt.Sprintf("%s-%d", prefix, i), "req", 1)
				if onResult != nil {
					onResult(r, err)
				}
				if err == nil && r.Outcome == engine.OutcomeReserved {
					mu.Lock()
					acked = append(acked, r.Reservation)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return acked
}

// The storm of the issue: 10,000 concurrent buyers on 1,000 units in 10 shards with
// stealProbes 2. No oversell at any sampled moment, every unit reserved by the end,
// conservation exact, every acknowledgement in the ledger.
func TestStorm(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(1000), withShards(10), withSteal(2))
		stop := make(chan struct{})
		var samples, acks atomic.Int64
		var sampler sync.WaitGroup
		sampler.Add(1)
		go func() {
			defer sampler.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				// Read before the counts, so that acks never exceed what the
				// ledger held when it was read.
				acked := acks.Load()
				c, err := f.e.Counts(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				// Checked against what did not come from the same counters:
				// the acknowledgements made so far, and the ledger's rows per
				// shard against each shard's allocation.
				if acked > c.Allocation || acked > c.Pending+c.Sold {
					t.Errorf("I1/I3 mid-storm: %d reservations acknowledged, the ledger holds %d pending and %d sold of %d", acked, c.Pending, c.Sold, c.Allocation)
				}
				for _, s := range c.Shards {
					if s.Available < 0 || s.Reserved < 0 || s.Pending+s.Sold > s.Allocation {
						t.Errorf("I1 violated mid-storm on shard %d: %+v", s.Index, s)
					}
				}
				if err := c.StockOversold(); err != nil {
					t.Errorf("I1 violated mid-storm: %v", err)
				}
				samples.Add(1)
			}
		}()
		outcomes := map[engine.Outcome]int{}
		var omu sync.Mutex
		acked := storm(t, f, 10_000, "buyer", func(r engine.ReserveResult, err error) {
			if err != nil {
				t.Errorf("reserve: %v", err)
				return
			}
			if r.Outcome == engine.OutcomeReserved {
				acks.Add(1)
			}
			omu.Lock()
			outcomes[r.Outcome]++
			omu.Unlock()
		})
		close(stop)
		sampler.Wait()
		if samples.Load() == 0 {
			t.Fatal("no sample taken during the storm")
		}
		if len(acked) != 1000 {
			t.Fatalf("%d reservations acknowledged for 1000 units (outcomes %v)", len(acked), outcomes)
		}
		if outcomes[engine.OutcomeSoldOut] != 9000 {
			t.Fatalf("outcomes %v", outcomes)
		}
		c := f.assertConserved()
		if c.Available != 0 || c.Reserved != 1000 || c.Pending != 1000 {
			t.Fatalf("counts %+v", c)
		}
		seen := map[string]bool{}
		for _, r := range acked {
			if seen[r.ID] {
				t.Fatalf("reservation %s acknowledged twice", r.ID)
			}
			seen[r.ID] = true
			if s := orderStatus(t, f, r.ID); s != ledger.StatusPending {
				t.Fatalf("I3: acknowledged %s has ledger status %q", r.ID, s)
			}
		}
		t.Logf("%d samples, outcomes %v", samples.Load(), outcomes)
	})
}
