package engine

import (
	"context"
	"sync"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A checkout or a cancel the ledger took may fail to mark Redis: the
// server does not answer, or the shard is being rebuilt and refuses
// (CommitRebuilding, stock.Rebuilding; the rebuild then restores the
// reservation as the ledger's read had it, held). Left to the sweeper, the
// reservation would count as held (and, paid, as sold too) and keep its
// unit and its buyer's quota until its expiry and grace, up to a day. So the
// engine tries the mark again, for as long as the sweeper would otherwise
// wait. Both marks are idempotent: one that ran already finds nothing to do.

// laterMarksMax bounds the marks kept; one more is left to the sweeper.
const laterMarksMax = 4096

// laterMarksEvery is how often the marks kept are tried again.
const laterMarksEvery = 500 * time.Millisecond

// laterMark is a checkout's commit mark, or a cancel's release, to try again.
type laterMark struct {
	shard     int
	key, user string
	cancel    bool
	until     time.Time // the sweeper's turn after that
}

type laterMarks struct {
	mu      sync.Mutex
	marks   []laterMark
	running bool
}

// markLater keeps m, and starts trying the marks kept if nobody is.
func (e *Engine) markLater(m laterMark) {
	m.until = e.now().Add(e.cfg.TTL + e.cfg.Grace)
	l := &e.later
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.marks) >= laterMarksMax {
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
	for {
		select {
		case <-e.closing:
			return
		case <-t.C:
		}
		l := &e.later
		l.mu.Lock()
		marks := l.marks
		l.marks = nil
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
			case refused[m.shard] || !e.tryMark(m):
				refused[m.shard] = true
				left = append(left, m)
			}
		}
		l.mu.Lock()
		l.marks = append(left, l.marks...)
		if len(l.marks) == 0 {
			l.running = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
}

// tryMark makes m's mark, and reports whether it is done with: made, or
// nothing left to make (the rebuild found the order ended already).
func (e *Engine) tryMark(m laterMark) bool {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if m.cancel {
		rr, err := e.store.Cancel(ctx, m.shard, m.key, m.user)
		if err != nil || rr.Code == stock.Rebuilding {
			return false
		}
		return e.afterRelease(ctx, m.shard, m.key, rr) == nil
	}
	n, err := e.store.MarkCommitted(ctx, m.shard, m.key)
	if err == nil && n == stock.CommitLedgerNeeded {
		n, err = e.markCommittedFromLedger(ctx, m.shard, m.key)
	}
	return err == nil && n != stock.CommitRebuilding
}
