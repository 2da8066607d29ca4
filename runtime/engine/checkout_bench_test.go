package engine_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// commandCounter counts the commands a client sends.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// BenchmarkCheckout measures one checkout through the engine (the ledger's
// conditional update, then the Redis steps) of a reservation made outside
// the timer, one caller at a time, and reports the Redis commands and the
// CPU of this process, Redis and PostgreSQL per checkout.
func BenchmarkCheckout(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr(), MaxRetries: -1})
	defer rdb.Close()
	cmds := &commandCounter{}
	rdb.AddHook(cmds)
	f := newFixture(b, rdb, withAllocation(10*int64(b.N)+100), withShards(10), withMaxPerUser(1))
	ctx := context.Background()
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = f.reserve("co-"+strconv.Itoa(i), "r", 1).Reservation.ID
	}
	cmds.n.Store(0)
	cpu0 := markCPU()
	b.ResetTimer()
	for i, id := range ids {
		co, err := f.e.Checkout(ctx, "co-"+strconv.Itoa(i), id, "pay")
		if err != nil || co.Outcome != ledger.CheckoutCommitted {
			b.Fatalf("%v %v", co.Outcome, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cmds.n.Load())/float64(b.N), "redis-cmds/op")
	markCPU().since(cpu0).report(b, b.N)
}
