package engine

import (
	"context"
	"sync"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A checkout or a cancel the ledger took may fail to mark Redis: the
// server does not answer, or the shard is being rebuilt and refuses
// (CommitRebuilding, stock.Rebuilding; the rebuild then restores the
// reservation as the ledger's read had it, held). Left to the sweeper, the
// reservation would count as held (and, paid, as sold too) and keep its
// unit and its buyer's quota until its expiry and grace, up to a day. So the
// engine tries the mark again until then. Both marks are idempotent: one
// that ran already finds nothing to do.

// laterMarksMax bounds the marks kept, those being tried included; one more
// is left to the sweeper.
const laterMarksMax = 4096

// laterMarksEvery is how often the marks kept are tried again.
const laterMarksEvery = 500 * time.Millisecond

// laterMark is a checkout's commit mark, or a cancel's release, to try again.
type laterMark struct {
	shard     int
	key, user string
	cancel    bool
	until     time.Time        // the reservation's expiry and grace: the sweeper's turn
	give      *stock.QuotaGive // a cancel's quota on the home shard (stolenQuota)
}

type laterMarks struct {
	mu      sync.Mutex
	marks   []laterMark
	trying  int // marks taken out by the round under way
	running bool
}

// markLater keeps m, and starts trying the marks kept if nobody is.
func (e *Engine) markLater(m laterMark) {
	l := &e.later
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.marks)+l.trying >= laterMarksMax || !e.now().Before(m.until) {
		return
	}
	l.marks = append(l.marks, m)
	if !l.running {
		l.running = true
		go e.runLaterMarks()
	}
}

// runLaterMarks tries the marks kept until none is left or the engine
// closes.
func (e *Engine) runLaterMarks() {
	t := time.NewTicker(laterMarksEvery)
	defer t.Stop()
	l := &e.later
	for {
		select {
		case <-e.closing:
			return
		case <-t.C:
		}
		l.mu.Lock()
		marks := l.marks
		l.marks, l.trying = nil, len(marks)
		l.mu.Unlock()
		var left []laterMark
		now := e.now()
		// A shard that refused a mark (still being rebuilt, or not
		// answering) is not sent the others of this round: a rebuild that
		// fails keeps a shard closed for as long as it takes.
		refused := map[int]bool{}
		for _, m := range marks {
			switch {
			case !now.Before(m.until):
			case e.closed() || refused[m.shard] || !e.tryMark(m):
				refused[m.shard] = true
				left = append(left, m)
			}
		}
		l.mu.Lock()
		l.marks, l.trying = append(left, l.marks...), 0
		if len(l.marks) == 0 || e.closed() {
			l.running = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
}

// sweepersTurn is when the sweeper settles o's reservation: its expiry and
// grace (from now, when o does not say).
func (e *Engine) sweepersTurn(o ledger.Order) time.Time {
	if o.ExpiresAt.IsZero() {
		return e.now().Add(e.cfg.TTL + e.cfg.Grace)
	}
	return o.ExpiresAt.Add(e.cfg.Grace)
}

func (e *Engine) closed() bool {
	select {
	case <-e.closing:
		return true
	default:
		return false
	}
}

// tryMark makes m's mark, and reports whether it is done with: made, or
// nothing left to make (the rebuild found the order ended already).
func (e *Engine) tryMark(m laterMark) bool {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if m.cancel {
		return e.cancelInRedis(ctx, m)
	}
	n, err := e.store.MarkCommitted(ctx, m.shard, m.key)
	if err == nil && n == stock.CommitLedgerNeeded {
		n, err = e.markCommittedFromLedger(ctx, m.shard, m.key)
	}
	return err == nil && n != stock.CommitRebuilding
}

// redisStepWait bounds how long a payment or a cancel waits for a Redis step
// of its own. The steps are best effort (the ledger is the judge), and a
// server that stalls holds each reply for the client's read timeout, whatever
// the request's deadline: it must not spend the request's time before the
// ledger is asked, nor hold the answer after. A step not done by then goes
// on by itself, on a context of its own.
const redisStepWait = 250 * time.Millisecond

// redisStepsMax bounds the steps going on by themselves: under a stall they
// would pile up at the request rate, each holding a connection the
// reservations need. A step beyond it is not made (queued, the caller's
// full says, with markLater; the sweeper's otherwise).
const redisStepsMax = 256

// redisStep runs step, waiting at most redisStepWait for it. full, when
// set, runs instead when redisStepsMax steps are under way.
func (e *Engine) redisStep(ctx context.Context, step func(context.Context), full func()) {
	select {
	case e.steps <- struct{}{}:
	default:
		if full != nil {
			full()
		}
		return
	}
	done := make(chan struct{})
	go func() {
		defer func() { <-e.steps }()
		defer close(done)
		cctx, cancel := detached(ctx)
		defer cancel()
		step(cctx)
	}()
	t := time.NewTimer(redisStepWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
