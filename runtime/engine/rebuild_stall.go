package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// ErrRebuildStalled means a rebuild made no progress for
// RebuildOptions.StallAfter: a ledger or Redis call did not return, as with
// a server that stopped answering without closing its connections (a hung
// disk, a process stopped), which no read timeout of PostgreSQL's notices.
var ErrRebuildStalled = errors.New("rebuild stalled")

// stallWatch cancels a rebuild's context once nothing moved for a while:
// no batch read from the ledger, none written to Redis, no step done.
type stallWatch struct {
	base   time.Time
	last   atomic.Int64 // since base, when the rebuild last moved
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// watchStall returns ctx, cancelled with a cause wrapping ErrRebuildStalled
// when tick is not called for after (0: never), and the watch.
func watchStall(ctx context.Context, after time.Duration) (context.Context, *stallWatch) {
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
				if idle := time.Since(w.base) - time.Duration(w.last.Load()); idle >= after {
					w.cancel(fmt.Errorf("%w: nothing read from the ledger or written to Redis for %s", ErrRebuildStalled, idle.Round(time.Second)))
					return
				}
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
