package stock

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// holdPipelines keeps every pipeline of reserve calls at the client while
// shut, and counts how many it holds at once.
type holdPipelines struct {
	mu         sync.Mutex
	gate       chan struct{} // closed: pipelines go
	held, most int           // pipelines held now, and at most
	heldCalls  int           // the calls in the pipelines held now
}

func (h *holdPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holdPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *holdPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "evalsha" {
			h.mu.Lock()
			gate := h.gate
			h.held++
			h.heldCalls += len(cmds)
			h.most = max(h.most, h.held)
			h.mu.Unlock()
			<-gate
			h.mu.Lock()
			h.held--
			h.heldCalls -= len(cmds)
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

func (h *holdPipelines) shut() {
	h.mu.Lock()
	h.gate, h.most = make(chan struct{}), 0
	h.mu.Unlock()
}

func (h *holdPipelines) open() {
	h.mu.Lock()
	close(h.gate)
	h.mu.Unlock()
}

func (h *holdPipelines) counts() (held, most, heldCalls int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held, h.most, h.heldCalls
}

// InFlight pipelines go out to one server at once; later calls queue for the
// next, except that one more goes when a full batch waits. Calls are sent one
// at a time, each waited for until it is held in a pipeline or queued, so the
// figures do not depend on scheduling.
func TestPipelinesInFlight(t *testing.T) {
	for _, c := range []struct {
		cfg      PipelineConfig
		calls    int
		wantMost int
	}{
		{PipelineConfig{MaxBatch: 64}, 6, 1},              // the default: one
		{PipelineConfig{MaxBatch: 64, InFlight: 3}, 6, 3}, // three, then a queue
		{PipelineConfig{MaxBatch: 2, InFlight: 1}, 7, 2},  // one, and one more for a full batch
		{PipelineConfig{MaxBatch: 2, InFlight: 2}, 9, 3},
	} {
		t.Run(fmt.Sprintf("batch=%d/inflight=%d", c.cfg.MaxBatch, c.cfg.InFlight), func(t *testing.T) {
			_, rdb, s := oneShard(t, 100)
			hold := &holdPipelines{gate: make(chan struct{})}
			close(hold.gate)
			rdb.AddHook(hold)
			s.WithPipeline(c.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if res, err := reserveOne(ctx, s, "warm"); err != nil || res.Code != Reserved {
				t.Fatalf("warm-up: %v %v", res.Code, err)
			}
			hold.shut()
			b := &s.server(rdb.Options().Addr).batch

			errs := make([]error, c.calls)
			var wg sync.WaitGroup
			for i := range c.calls {
				wg.Go(func() {
					var res ShardResult
					res, errs[i] = reserveOne(ctx, s, fmt.Sprintf("u%d", i))
					if errs[i] == nil && res.Code != Reserved {
						errs[i] = fmt.Errorf("code %v", res.Code)
					}
				})
				// Every call sent so far is queued or in a held pipeline, and
				// every pipeline taken is held.
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
					b.mu.Lock()
					taken, waiting := b.busy, len(b.queue)
					b.mu.Unlock()
					held, _, heldCalls := hold.counts()
					if held == taken && waiting+heldCalls == i+1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("call %d: %d pipelines held (%d calls), %d taken, %d calls queued", i, held, heldCalls, taken, waiting)
					}
				}
			}
			if _, most, _ := hold.counts(); most != c.wantMost {
				t.Errorf("%d pipelines out at once, want %d", most, c.wantMost)
			}
			hold.open()
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("call %d: %v", i, err)
				}
			}
		})
	}
}
