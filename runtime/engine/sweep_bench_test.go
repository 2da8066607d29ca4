package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// sweepBenchRTTs are the delays BenchmarkSweep adds to the round trips
// between the sweeper and Redis: none (the proxy's own, on this machine's
// loopback), and 1 ms, a sweeper pod in another zone than its Redis.
var sweepBenchRTTs = []time.Duration{0, time.Millisecond}

// BenchmarkSweep measures how fast the sweeper gives back a backlog of
// expired reservations: b.N of them, made by as many buyers outside the
// timer, then swept by a sweeper engine of its own until every one is
// released. The sweeper reaches Redis through a fault proxy that delays
// each reply by the variant's delay. It reports releases per second and
// the CPU of this process, Redis and PostgreSQL per release. The sale has 4
// shards and every buyer reserves on its home shard; in the stolen
// variants it has 2, every buyer is homed on the second, and half of them
// find it sold out and take their unit from the first: those releases also
// give the buyers' quota back on the home shard, as in a sale that sold out.
//
//	go test -run '^$' -bench Sweep -benchtime 20000x ./runtime/engine/
func BenchmarkSweep(b *testing.B) {
	for _, stolen := range []bool{false, true} {
		for _, rtt := range sweepBenchRTTs {
			name := fmt.Sprintf("rtt=+%v", rtt)
			if stolen {
				name += "/stolen"
			}
			b.Run(name, func(b *testing.B) { benchmarkSweep(b, rtt, stolen) })
		}
	}
}

func benchmarkSweep(b *testing.B, rtt time.Duration, stolen bool) {
	ctx := context.Background()
	direct := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr(), PoolSize: 64})
	defer direct.Close()
	if err := direct.FlushAll(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	proxy := testharness.FaultProxyT(b, sharedRedis.Addr())
	if rtt > 0 {
		if _, err := proxy.Latency(testharness.Downstream, rtt); err != nil {
			b.Fatal(err)
		}
	}
	viaProxy := redis.NewClient(&redis.Options{Addr: proxy.Addr(), PoolSize: 64})
	defer viaProxy.Close()

	shards, allocation, buyer := 4, 2*int64(b.N), func(i int) string { return fmt.Sprintf("buyer-%d", i) }
	if stolen {
		shards, allocation = 2, int64(b.N)
		var homed []string
		for i := 0; len(homed) < b.N; i++ {
			if u := fmt.Sprintf("buyer-%d", i); stock.HomeShard(u, 2) == 1 {
				homed = append(homed, u)
			}
		}
		buyer = func(i int) string { return homed[i] }
	}
	f := newFixture(b, direct, withShards(shards), withAllocation(allocation), withSteal(1), withTTL(time.Second, 0))
	reserveConcurrently(b, f, b.N, buyer)
	// As autovacuum would have within a minute of the sale's first orders
	// (and the sweeper's first cancel does, since it needs them): with no
	// statistics, the planner takes the new sale for a few rows and reaches
	// each batch's orders through a scan of the sale.
	if _, err := f.l.Pool().Exec(ctx, `ANALYZE flashsale_orders`); err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second + 200*time.Millisecond)
	sweeper := openEngine(b, f.cfg, viaProxy, f.l)

	cpu0 := markCPU()
	start := time.Now()
	b.ResetTimer()
	released := 0
	for passes := 0; released < b.N; passes++ {
		st, err := sweeper.Sweep(ctx)
		if err != nil {
			b.Fatal(err)
		}
		released += st.Released
		if st.Released == 0 && passes > 10 {
			b.Fatalf("released %d of %d: a pass released nothing", released, b.N)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "releases/s")
	markCPU().since(cpu0).report(b, b.N)
	if c := f.assertConserved(); c.Reserved != 0 || c.Available != allocation {
		b.Fatalf("after the sweep: %+v", c)
	}
}

// reserveConcurrently makes n one-unit reservations by the buyers buyer(i),
// 64 at a time (one at a time, each would wait for its own ledger commit).
func reserveConcurrently(b *testing.B, f *fixture, n int, buyer func(i int) string) {
	var (
		wg   sync.WaitGroup
		next = make(chan int)
		fail = make(chan error, 1)
	)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r, err := f.e.Reserve(context.Background(), buyer(i), "r", 1)
				if err == nil && r.Outcome != engine.OutcomeReserved {
					err = fmt.Errorf("reserve %d: %s", i, r.Outcome)
				}
				if err != nil {
					select {
					case fail <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-fail:
		b.Fatal(err)
	default:
	}
}
