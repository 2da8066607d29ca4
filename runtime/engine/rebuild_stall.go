package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// ErrRebuildStalled means a rebuild made no progress for
// RebuildOptions.StallAfter and the ledger did not answer a new connection
// either: a call to a server that stopped answering without closing its
// connections (a proxy whose server is gone, a stopped process) never
// returns, and no read timeout of PostgreSQL's notices.
var ErrRebuildStalled = errors.New("rebuild stalled")

// stallProbeTimeout bounds the probe of a rebuild that made no progress.
const stallProbeTimeout = 30 * time.Second

// stallWatch cancels a rebuild's context once nothing moved for a while (no
// batch read from the ledger, none written to Redis, no step done) and the
// ledger does not answer a probe on a connection of its own. A ledger that
// answers is working on a long statement (cancelling a million expired
// orders, waiting for a lock) and is waited for.
type stallWatch struct {
	base   time.Time
	last   atomic.Int64 // since base, when the rebuild last moved
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// watchStall returns ctx, cancelled with a cause wrapping ErrRebuildStalled
// when tick is not called for after (0: never) and alive then fails, and
// the watch.
func watchStall(ctx context.Context, after time.Duration, alive func(context.Context) error) (context.Context, *stallWatch) {
	w := &stallWatch{base: time.Now(), done: make(chan struct{})}
	ctx, w.cancel = context.WithCancelCause(ctx)
	if after <= 0 {
		return ctx, w
	}
	go func() {
		t := time.NewTicker(max(after/8, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			idle := time.Since(w.base) - time.Duration(w.last.Load())
			if idle < after {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, min(after, stallProbeTimeout))
			err := alive(pctx)
			cancel()
			switch {
			case ctx.Err() != nil:
				return
			case err == nil:
				w.tick()
			default:
				w.cancel(fmt.Errorf("%w: nothing read from the ledger or written to Redis for %s, and a new connection to the ledger did not answer either (%v)",
					ErrRebuildStalled, idle.Round(time.Second), err))
				return
			}
		}
	}()
	return ctx, w
}

// tick says the rebuild moved.
func (w *stallWatch) tick() { w.last.Store(int64(time.Since(w.base))) }

// stop ends the watch.
func (w *stallWatch) stop() {
	close(w.done)
	w.cancel(nil)
}

// explain puts the stall first in err when it is why err happened: the
// call that failed only says that it was cancelled.
func (w *stallWatch) explain(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, ErrRebuildStalled) && !errors.Is(err, ErrRebuildStalled) {
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}
