package stock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// PipelineConfig batches concurrent reserve script calls to one Redis server
// into pipelines: one write carries many EVALSHA calls and the server reads
// them in one go, so it pays its per-read and per-write cost once per batch.
//
// A batch goes as soon as fewer than InFlight pipelines to that server are
// out: calls that arrive while they are go together in the next, so batches
// grow with the load (the ledger's group commit does the same). Zero values:
// no batching.
type PipelineConfig struct {
	// MaxBatch is the most calls in one pipeline; 0 or 1: every call on its
	// own, as a single command.
	MaxBatch int
	// Linger is how long a pipeline waits for more calls after taking its
	// first, unless MaxBatch are waiting; 0: it goes at once.
	Linger time.Duration
	// InFlight is how many pipelines may be out to one server at once before
	// calls queue for the next; 0 means 1. With 1 a call that arrives just
	// after a pipeline left waits for its whole round trip; more lets it go at
	// once, in a smaller batch. One more always goes when a full batch waits.
	InFlight int
}

// inFlight is InFlight with its default.
func (c PipelineConfig) inFlight() int { return max(c.InFlight, 1) }

// Enabled reports whether calls are batched.
func (c PipelineConfig) Enabled() bool { return c.MaxBatch > 1 }

// Validate refuses a negative batch size, linger or number of pipelines.
func (c PipelineConfig) Validate() error {
	if c.MaxBatch < 0 || c.Linger < 0 || c.InFlight < 0 {
		return fmt.Errorf("reserve pipeline: batch size %d, linger %s and pipelines in flight %d must not be negative", c.MaxBatch, c.Linger, c.InFlight)
	}
	return nil
}

// pipelineTimeout bounds one pipeline beyond the client's read and write
// timeouts, which bound each of its reads and writes.
const pipelineTimeout = 5 * time.Second

// ErrNotSent: nothing was sent for a call, so it did not run: its caller's
// context ended while it waited for a pipeline, or an earlier pipeline of
// its batch went unanswered (eachOn).
var ErrNotSent = errors.New("call not sent")

// batcher queues the reserve script calls to one server.
type batcher struct {
	mu    sync.Mutex
	queue []*batchCall
	busy  int           // pipelines taken and not yet answered
	wake  chan struct{} // poked when a lingering pipeline may go; capacity 1
}

type batchCall struct {
	ctx   context.Context
	node  *redis.Client
	cmd   *redis.Cmd
	taken bool          // in a pipeline (under batcher.mu)
	err   error         // set before done closes when the call was not sent
	done  chan struct{} // closed once cmd (or err) holds the outcome
}

// testDefaultPipeline is the PipelineConfig of a new Store; tests set it to
// run every reserve call of the package's tests through pipelines.
var testDefaultPipeline PipelineConfig

// testHookPipelineSent, when set by a test, runs after a pipeline's commands
// were handed to the client, with the batch size and whether it failed.
var testHookPipelineSent func(size int, err error)

// do sends cmd in the next pipeline to node's server and returns its reply.
// A reply lost with the pipeline (a timeout, a reset) is cmd's error, as for
// a single command: the pipeline holds NoRetry commands, which go-redis never
// sends again, and it is not sent again here either; the caller resolves the
// doubt as it does for a lost single reply. A caller whose ctx ends while its
// call is still queued gets ErrNotSent at once. Once the call is in a
// pipeline, its reply is awaited whatever ctx says, as go-redis awaits a
// single command's (bounded by the client's timeouts and pipelineTimeout): a
// reply given up on would leave the caller unable to tell a reservation it
// took from one placed before, and the unit held with no ledger row.
func (b *batcher) do(ctx context.Context, cfg PipelineConfig, node *redis.Client, cmd *redis.Cmd) ([]any, error) {
	c := &batchCall{ctx: ctx, node: node, cmd: cmd, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	full := len(b.queue) >= cfg.MaxBatch
	start := b.busy < cfg.inFlight() || full && b.busy <= cfg.inFlight()
	if start {
		b.busy++
	}
	b.mu.Unlock()
	switch {
	case start:
		go b.flush(cfg)
	case full:
		b.poke()
	}
	select {
	case <-c.done:
		if c.err != nil {
			return nil, c.err
		}
		return cmd.Slice()
	case <-ctx.Done():
	}
	b.mu.Lock()
	if i := slices.Index(b.queue, c); i >= 0 && !c.taken {
		b.queue = slices.Delete(b.queue, i, i+1)
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", ErrNotSent, ctx.Err())
	}
	b.mu.Unlock()
	<-c.done
	if c.err != nil {
		return nil, c.err
	}
	return cmd.Slice()
}

func (b *batcher) poke() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// flush sends pipelines while calls are queued; it holds one of b.busy.
func (b *batcher) flush(cfg PipelineConfig) {
	for {
		batch := b.take(cfg)
		if batch == nil {
			return
		}
		b.send(batch)
	}
}

// take waits out the linger and cuts the next batch, or gives up its slot
// (nil) when nothing is queued.
func (b *batcher) take(cfg PipelineConfig) []*batchCall {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.busy--
		b.mu.Unlock()
		return nil
	}
	if cfg.Linger > 0 && len(b.queue) < cfg.MaxBatch {
		b.mu.Unlock()
		t := time.NewTimer(cfg.Linger)
		select {
		case <-t.C:
		case <-b.wake:
		}
		t.Stop()
		b.mu.Lock()
		if len(b.queue) == 0 { // every caller gave up
			b.busy--
			b.mu.Unlock()
			return nil
		}
	}
	k := min(len(b.queue), cfg.MaxBatch)
	batch := slices.Clone(b.queue[:k])
	for _, c := range batch {
		c.taken = true
	}
	rest := copy(b.queue, b.queue[k:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	another := rest >= cfg.MaxBatch && b.busy <= cfg.inFlight()
	if another {
		b.busy++
	}
	b.mu.Unlock()
	if another {
		go b.flush(cfg)
	}
	return batch
}

// send runs one pipeline and hands every call its reply.
func (b *batcher) send(batch []*batchCall) {
	out := batch[:0:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = fmt.Errorf("%w: %w", ErrNotSent, err)
			close(c.done)
			continue
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return
	}
	// The callers' values (tracing, hooks) but none's cancellation: the
	// pipeline is shared, and the client's timeouts bound it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(out[0].ctx), pipelineTimeout)
	pipe := out[len(out)-1].node.Pipeline()
	for _, c := range out {
		_ = pipe.Process(ctx, noRetryCmd{c.cmd})
	}
	_, err := pipe.Exec(ctx)
	cancel()
	if testHookPipelineSent != nil {
		testHookPipelineSent(len(out), err)
	}
	for _, c := range out {
		close(c.done)
	}
}
