package engine

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/flashsale-dev/flashsale-operator/internal/failpoint"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// CheckoutResult is the answer to Checkout.
type CheckoutResult struct {
	Outcome ledger.CheckoutOutcome
	Order   ledger.Order
}

// Checkout commits a reservation for its own user: PENDING → COMMITTED in the ledger
// while it has not expired by the database clock, idempotent for the same payment
// token. A payment after expiry never commits; the ledger records it for voiding.
// The Redis hash is then marked committed (best effort; the sweeper repairs).
func (e *Engine) Checkout(ctx context.Context, user, reservationID, paymentToken string) (CheckoutResult, error) {
	if user == "" || paymentToken == "" {
		return CheckoutResult{}, fmt.Errorf("%w: user and payment token are required", ErrInvalid)
	}
	shard, key, err := stock.ParseID(reservationID, e.cfg.Shards)
	if err != nil {
		return CheckoutResult{Outcome: ledger.CheckoutNotFound}, nil
	}
	// Marked paying before the ledger commits: if this process dies (or loses
	// Redis) between the commit and the Redis step, the next sweep finds the
	// mark and settles the reservation from the ledger, instead of counting
	// its unit both reserved and sold until its expiry and grace. A failed
	// mark (Redis down) does not stop a payment: the ledger is the judge, and
	// the sweep then settles the reservation after its expiry as before; nor
	// does a mark that takes longer than redisStepWait.
	var marked atomic.Int64 // when the mark was written; 0: not (yet)
	e.redisStep(ctx, func(ctx context.Context) {
		at, _ := e.store.MarkPaying(ctx, shard, key, user)
		marked.Store(at)
	}, nil)
	out, o, err := e.ledger.Checkout(ctx, e.cfg.CampaignID, reservationID, user, paymentToken)
	if err != nil {
		// The commit's outcome may be unknown: the mark stays for the sweep.
		return CheckoutResult{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	failpoint.Kill(failpoint.CheckoutAfterLedger)
	if markedAt := marked.Load(); out != ledger.CheckoutCommitted && out != ledger.CheckoutAlreadyCommitted && markedAt > 0 {
		e.redisStep(ctx, func(ctx context.Context) {
			_, _ = e.store.DropPaying(ctx, shard, key, markedAt) // else the sweep drops it
		}, nil)
	}
	if out == ledger.CheckoutCommitted || out == ledger.CheckoutAlreadyCommitted {
		later := laterMark{shard: shard, key: key, user: user, until: e.sweepersTurn(o)}
		e.redisStep(ctx, func(ctx context.Context) {
			if n, err := e.store.MarkCommitted(ctx, shard, key); err != nil || n == stock.CommitRebuilding || n == stock.CommitLedgerNeeded {
				e.markLater(later)
			}
			if home := stock.HomeShard(user, e.cfg.Shards); home != shard {
				// A sold stolen reservation keeps its quota but not its pointer:
				// a retry of the request is answered from the ledger. If this
				// fails, the sweeper's reaper forgets the pointer.
				_, _ = e.store.Quota(ctx, home, stock.QuotaForget, user, key, o.Quantity, shard, o.ExpiresAt.UnixMilli())
			}
		}, func() { e.markLater(later) })
	}
	return CheckoutResult{Outcome: out, Order: o}, nil
}

// CancelResult is the answer to Cancel.
type CancelResult struct {
	Outcome ledger.CancelOutcome
	Order   ledger.Order
}

// Cancel is the buyer's own cancel: SQL first (PENDING → CANCELLED_BY_USER), then
// the units go back in Redis. When the Redis step fails the sweeper finishes it.
func (e *Engine) Cancel(ctx context.Context, user, reservationID string) (CancelResult, error) {
	if user == "" {
		return CancelResult{}, fmt.Errorf("%w: user is required", ErrInvalid)
	}
	shard, key, err := stock.ParseID(reservationID, e.cfg.Shards)
	if err != nil {
		return CancelResult{Outcome: ledger.CancelNotFound}, nil
	}
	out, o, err := e.ledger.CancelByUser(ctx, e.cfg.CampaignID, reservationID, user)
	if err != nil {
		return CancelResult{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if out == ledger.CancelCancelled || out == ledger.CancelAlreadyCancelled {
		// The ledger is the book of record: a Redis step that fails, or meets
		// a shard being rebuilt, is tried again (marks_later.go), and the
		// sweeper releases the units from the CANCELLED_BY_USER row after
		// that.
		later := laterMark{shard: shard, key: key, user: user, cancel: true, until: e.sweepersTurn(o),
			give: e.stolenQuota(shard, key, user, o)}
		e.redisStep(ctx, func(ctx context.Context) {
			if !e.cancelInRedis(ctx, later) {
				e.markLater(later)
			}
		}, func() { e.markLater(later) })
	}
	return CancelResult{Outcome: out, Order: o}, nil
}

// cancelInRedis is a cancel's Redis step: the units back on their shard,
// then, for a reservation stolen from its buyer's home shard, the quota
// there. It reports whether the step is done with; if not, it is tried
// again (marks_later.go).
func (e *Engine) cancelInRedis(ctx context.Context, m laterMark) bool {
	rr, err := e.store.Cancel(ctx, m.shard, m.key, m.user)
	switch {
	case err != nil || rr.Code == stock.Rebuilding:
		return false
	case rr.Code == stock.Released:
		return e.afterRelease(ctx, m.shard, m.key, rr) == nil
	case rr.Code == stock.NotFound && m.give != nil:
		// Released already: by a try whose answer or give-back was lost,
		// or by the sweeper. The answer names no buyer; the ledger's row
		// does, and the give-back is named by the placement, so it gives
		// nothing back twice.
		return e.giveQuota(ctx, stock.HomeShard(m.user, e.cfg.Shards), *m.give) == nil
	}
	return true
}

// stolenQuota is the give-back of the quota the order o of key, placed on
// shard, holds on its buyer's home shard when that is another shard; nil
// otherwise.
func (e *Engine) stolenQuota(shard int, key, user string, o ledger.Order) *stock.QuotaGive {
	if stock.HomeShard(user, e.cfg.Shards) == shard || o.ExpiresAt.IsZero() {
		return nil
	}
	return &stock.QuotaGive{Op: stock.QuotaRelease, User: user, Key: key, Quantity: o.Quantity, Shard: shard, ExpiryMs: o.ExpiresAt.UnixMilli()}
}

// Held lists the reservations the user holds in this sale, as the ledger
// has them: held (PENDING, until the sweeper releases them) and paid. A
// buyer who lost the answer to a reservation and its key finds it here,
// to pay for it or cancel it. A reservation whose ledger row is not
// written yet is not listed: it was not acknowledged either.
func (e *Engine) Held(ctx context.Context, user string) ([]ledger.Order, error) {
	if user == "" {
		return nil, fmt.Errorf("%w: user is required", ErrInvalid)
	}
	orders, err := e.ledger.HeldBy(ctx, e.cfg.CampaignID, user)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return orders, nil
}
