package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A request whose deadline passes while its reserve call is in a pipeline
// (the reply read, not yet handed out) is refused with its unit given back
// and no ledger row, as when the call is sent alone; the buyer's retry with
// the same key is then reserved. Told nothing of the reply, the engine took
// its own unit for one placed before: it answered 503, kept the unit held
// with no row, and answered the retries 503 until the unit expired.
func TestDeadlineInAPipelineGivesTheUnitBack(t *testing.T) {
	t.Parallel()
	rdb := standaloneClient(t, sharedRedis.Addr()).(*redis.Client)
	f := newFixture(t, rdb, withAllocation(10), withShards(1), func(c *fixtureConfig) {
		c.Pipeline = stock.PipelineConfig{MaxBatch: 4}
	})
	f.reserve("warm", "k-warm", 1) // loads the script
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rdb.AddHook(&afterReply{then: func() {
		cancel()
		time.Sleep(200 * time.Millisecond) // the request sees its deadline first
	}})
	_, err := f.e.Reserve(ctx, "late", "k-late", 1)
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("a request whose deadline passed in its pipeline: %v, want ErrUnavailable", err)
	}
	if c := f.assertConserved(); c.Reserved != 1 || c.Available != 9 {
		t.Fatalf("after the refusal: %d reserved, %d available; want only the warm-up's unit held", c.Reserved, c.Available)
	}
	if r := f.reserve("late", "k-late", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatalf("the retry: %v, want RESERVED", r.Outcome)
	}
	f.assertConserved()
}

// afterReply runs then once, after the first pipeline's replies are read
// and before the pipeline returns.
type afterReply struct {
	then func()
	done atomic.Bool
}

func (h *afterReply) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *afterReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *afterReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if h.done.CompareAndSwap(false, true) {
			h.then()
		}
		return err
	}
}
