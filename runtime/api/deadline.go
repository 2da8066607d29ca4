package api

import (
	"context"
	"sync/atomic"
	"time"
)

// deadlineSlot is how long one shared request context is handed out: every
// request that starts within it shares the context, and so one timer.
const deadlineSlot = time.Millisecond

// requestDeadlines hands out the contexts that bound a request's Redis and SQL
// work. A context and a timer per request (context.WithTimeout and its cancel)
// cost about 2 µs of CPU, 4.7% of the reserve process at 64 buyers; one
// context per millisecond, shared by the requests that start in it, costs a
// clock read. A request's deadline is therefore between RequestTimeout and
// RequestTimeout+1ms after it starts.
//
// The contexts do not end when the client goes away: a request that has
// started its Redis or SQL work finishes it, within the same deadline, instead
// of being cut between two steps. Nobody reads its answer; a retry with the
// same idempotency_key is answered as a replay.
type requestDeadlines struct {
	timeout time.Duration
	cur     atomic.Pointer[deadlineShare]
}

type deadlineShare struct {
	ctx   context.Context
	until time.Time // the last moment a request may start under ctx, exclusive
	// cancel is called only when another request's share won the race to be
	// current; a share in use ends itself at its deadline.
	cancel context.CancelFunc
}

func newRequestDeadlines(timeout time.Duration) *requestDeadlines {
	return &requestDeadlines{timeout: timeout}
}

// context returns the context of a request starting now.
func (d *requestDeadlines) context() context.Context {
	now := time.Now()
	if s := d.cur.Load(); s != nil && now.Before(s.until) {
		return s.ctx
	}
	return d.next(now)
}

// next makes the share of the slot starting now current, unless another
// request made one first.
func (d *requestDeadlines) next(now time.Time) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(deadlineSlot+d.timeout))
	s := &deadlineShare{ctx: ctx, until: now.Add(deadlineSlot), cancel: cancel}
	for {
		old := d.cur.Load()
		if old != nil && now.Before(old.until) {
			s.cancel() // lost the race: its timer is not needed
			return old.ctx
		}
		if d.cur.CompareAndSwap(old, s) {
			return ctx
		}
	}
}
