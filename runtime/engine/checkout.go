package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

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
	})
	out, o, err := e.ledger.Checkout(ctx, e.cfg.CampaignID, reservationID, user, paymentToken)
	if err != nil {
		// The commit's outcome may be unknown: the mark stays for the sweep.
		return CheckoutResult{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	failpoint.Kill(failpoint.CheckoutAfterLedger)
	if markedAt := marked.Load(); out != ledger.CheckoutCommitted && out != ledger.CheckoutAlreadyCommitted && markedAt > 0 {
		e.redisStep(ctx, func(ctx context.Context) {
			_, _ = e.store.DropPaying(ctx, shard, key, markedAt) // else the sweep drops it
		})
	}
	if out == ledger.CheckoutCommitted || out == ledger.CheckoutAlreadyCommitted {
		e.redisStep(ctx, func(ctx context.Context) {
			if n, err := e.store.MarkCommitted(ctx, shard, key); err != nil || n == stock.CommitRebuilding {
				e.markLater(laterMark{shard: shard, key: key, user: user})
			}
			if home := stock.HomeShard(user, e.cfg.Shards); home != shard {
				// A sold stolen reservation keeps its quota but not its pointer:
				// a retry of the request is answered from the ledger. If this
				// fails, the sweeper's reaper forgets the pointer.
				_, _ = e.store.Quota(ctx, home, stock.QuotaForget, user, key, o.Quantity, shard, o.ExpiresAt.UnixMilli())
			}
		})
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
		e.redisStep(ctx, func(ctx context.Context) {
			if rr, err := e.store.Cancel(ctx, shard, key, user); err != nil || rr.Code == stock.Rebuilding {
				e.markLater(laterMark{shard: shard, key: key, user: user, cancel: true})
			} else {
				_ = e.afterRelease(ctx, shard, key, rr)
			}
		})
	}
	return CancelResult{Outcome: out, Order: o}, nil
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

// redisStepWait bounds how long a payment or a cancel waits for a Redis step
// of its own. The steps are best effort (the ledger is the judge), and a
// server that stalls holds each reply for the client's read timeout, whatever
// the request's deadline: it must not spend the request's time before the
// ledger is asked, nor hold the answer after. A step not done by then goes
// on by itself, on a context of its own.
const redisStepWait = 250 * time.Millisecond

func (e *Engine) redisStep(ctx context.Context, step func(context.Context)) {
	done := make(chan struct{})
	go func() {
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
