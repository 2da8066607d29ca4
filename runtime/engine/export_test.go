package engine

import (
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Store is the engine's shards, for the tests that set a shard up or look at
// it directly.
func (e *Engine) Store() *stock.Store { return e.store }

// Ledger is the engine's ledger, for the tests that read or write it directly.
func (e *Engine) Ledger() *ledger.Ledger { return e.ledger }

// SetCountsBetweenReads makes Counts run f between its ledger read and its
// Redis read, for the tests that move units in that moment.
func (e *Engine) SetCountsBetweenReads(f func()) { e.countsBetweenReads = f }

// SetSweepBudget sets the batches a pass sweeps on a shard (0: the default).
func (e *Engine) SetSweepBudget(batches int) { e.sweepBudget = batches }

// SetSweptBatch makes the sweep run f after each batch of expired
// reservations, for the tests that count them.
func (e *Engine) SetSweptBatch(f func()) { e.sweptBatch = f }

// MarkLater keeps a commit mark of key to try again until until.
func (e *Engine) MarkLater(shard int, key, user string, until time.Time) {
	e.markLater(laterMark{shard: shard, key: key, user: user, until: until})
}

// LaterMarks is how many marks are kept, and how many of them the round
// under way is trying.
func (e *Engine) LaterMarks() (kept, trying int) {
	e.later.mu.Lock()
	defer e.later.mu.Unlock()
	return len(e.later.marks) + e.later.trying, e.later.trying
}

// LaterMarksMax is laterMarksMax.
const LaterMarksMax = laterMarksMax
