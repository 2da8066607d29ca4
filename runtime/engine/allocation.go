package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// ErrAllocationPending means a decrease could not finish yet: too few units are
// available right now (they are reserved). The withdrawn units stay out of stock
// and the next call continues.
var ErrAllocationPending = errors.New("allocation decrease pending")

// ErrBelowHeld refuses an allocation below the units sold and reserved.
var ErrBelowHeld = ledger.ErrBelowHeld

// ErrAllocationMoved: withdrawn units were not given back because the
// ledger's allocation moved since it was read (a decrease whose outcome was
// lost committed meanwhile); the next call starts from the ledger again.
var ErrAllocationMoved = ledger.ErrAllocationMoved

// ApplyAllocation brings the campaign's allocation to target, exactly once.
//
// An increase (restock) is recorded in the ledger with its per-shard deltas, then
// each shard adds its delta at most once (its meta remembers the last change id).
// A decrease first withdraws units from the shards' stock atomically (withdrawn
// units can never be reserved), then records the decrease in the ledger, which
// refuses it if the sold and reserved units no longer fit, then settles it on each
// shard. Repeating the call, or calling it after a crash halfway, finishes what was
// recorded and adds or removes nothing twice. It reports whether anything changed.
func (e *Engine) ApplyAllocation(ctx context.Context, target int64) (bool, error) {
	if target < 0 {
		return false, fmt.Errorf("%w: allocation %d is negative", ErrInvalid, target)
	}
	// The epoch is read first: a rebuild that starts after it refuses the
	// withdrawals below (stock.ErrRebuilt). Applying recorded changes moves
	// neither the allocation nor the epoch, and reads its own.
	c, err := e.ledger.GetCampaign(ctx, e.cfg.CampaignID)
	if err != nil {
		return false, ledgerFailure("campaign", err)
	}
	// Changes already recorded are settled first: a recorded decrease owns the
	// units withdrawn for it, and the give-backs below would otherwise put them
	// back into stock before the decrease takes them out of the allocation.
	changed, err := e.applyRecordedChanges(ctx)
	if err != nil {
		return false, err
	}
	switch {
	case target > c.Allocation:
		if err := e.giveBackWithdrawn(ctx, c.Allocation, -1); err != nil {
			return false, err
		}
		_, planned, err := e.ledger.PlanAllocationIncrease(ctx, e.cfg.CampaignID, target)
		if err != nil {
			return false, ledgerFailure("plan allocation increase", err)
		}
		changed = changed || planned
	case target < c.Allocation:
		if err := e.withdrawForDecrease(ctx, c, target); err != nil {
			return false, err
		}
		changed = true
	default:
		// Units withdrawn for a decrease that is no longer wanted go back.
		if err := e.giveBackWithdrawn(ctx, c.Allocation, -1); err != nil {
			return false, err
		}
	}
	applied, err := e.applyRecordedChanges(ctx)
	return changed || applied, err
}

// applyRecordedChanges applies every change the ledger holds and Redis does
// not, under the epoch read with them (see ledger.UnappliedChanges).
func (e *Engine) applyRecordedChanges(ctx context.Context) (bool, error) {
	epoch, changes, err := e.ledger.UnappliedChanges(ctx, e.cfg.CampaignID)
	if err != nil {
		return false, ledgerFailure("unapplied changes", err)
	}
	for _, ch := range changes {
		increase := ch.ToAllocation > ch.FromAllocation
		for shard, d := range ch.ShardDeltas {
			if d == 0 {
				continue
			}
			stockDelta, settled := d, int64(0)
			if !increase {
				stockDelta, settled = 0, -d
			}
			n, err := e.store.Adjust(ctx, shard, epoch, ch.ID, d, stockDelta, settled)
			if err != nil {
				return false, err
			}
			if n == -1 {
				return false, fmt.Errorf("%w: shard %d has no meta", ErrNeedsRebuild, shard)
			}
		}
		if err := e.ledger.MarkChangeApplied(ctx, ch.ID); err != nil {
			return false, ledgerFailure("mark change applied", err)
		}
	}
	return len(changes) > 0, nil
}

// withdrawForDecrease takes the units of a decrease out of the shards' stock, the
// fullest shards first, then records the decrease in the ledger.
func (e *Engine) withdrawForDecrease(ctx context.Context, c ledger.Campaign, target int64) error {
	need := c.Allocation - target
	held, err := e.ledger.CountsByShard(ctx, e.cfg.CampaignID, e.cfg.Shards)
	if err != nil {
		return ledgerFailure("counts", err)
	}
	var units int64
	for _, h := range held {
		units += h.Committed + h.Pending
	}
	if units > target {
		if err := e.giveBackWithdrawn(ctx, c.Allocation, -1); err != nil {
			return err
		}
		return fmt.Errorf("%w: %d units sold or reserved, allocation %d asked", ErrBelowHeld, units, target)
	}
	states, err := e.store.State(ctx)
	if err != nil {
		return err
	}
	var withdrawn int64
	for _, s := range states {
		withdrawn += s.Withdrawn
	}
	if withdrawn > need {
		if err := e.giveBackWithdrawn(ctx, c.Allocation, withdrawn-need); err != nil {
			return err
		}
		if states, err = e.store.State(ctx); err != nil {
			return err
		}
		withdrawn = need
	}
	sort.SliceStable(states, func(a, b int) bool { return states[a].Available > states[b].Available })
	for _, s := range states {
		if withdrawn == need {
			break
		}
		moved, total, err := e.store.Withdraw(ctx, s.Index, c.Epoch, need-withdrawn)
		if err != nil {
			return err
		}
		if total < 0 {
			return fmt.Errorf("%w: shard %d has no meta", ErrNeedsRebuild, s.Index)
		}
		withdrawn += moved
	}
	if withdrawn < need {
		return fmt.Errorf("%w: %d of %d units withdrawn, the rest is reserved", ErrAllocationPending, withdrawn, need)
	}
	if states, err = e.store.State(ctx); err != nil {
		return err
	}
	// Units counted here must have been withdrawn under the ledger's epoch: a
	// shard still at another (a rebuild started since, its turn not come yet)
	// would be rewritten from the rebuild's snapshot, its withdrawal dropped
	// and the units back in stock after the ledger took them out.
	for _, s := range states {
		if s.State == stock.StateRebuilding || s.Epoch != c.Epoch {
			return fmt.Errorf("shard %d (%s, epoch %d, the ledger's %d): %w", s.Index, s.State, s.Epoch, c.Epoch, stock.ErrRebuilt)
		}
	}
	deltas := make([]int64, len(states))
	var sum int64
	for _, s := range states {
		deltas[s.Index] = -s.Withdrawn
		sum += s.Withdrawn
	}
	if sum != need {
		return fmt.Errorf("%w: withdrawn %d units, expected %d", ErrAllocationPending, sum, need)
	}
	if _, err := e.ledger.RecordAllocationDecrease(ctx, e.cfg.CampaignID, c.Epoch, c.Allocation, target, deltas); err != nil {
		if errors.Is(err, ledger.ErrBelowHeld) {
			// Sold or reserved meanwhile: the decrease cannot happen; give the units back.
			if gerr := e.giveBackWithdrawn(ctx, c.Allocation, -1); gerr != nil {
				return errors.Join(err, gerr)
			}
			return err
		}
		if errors.Is(err, ErrAllocationMoved) {
			return err // the units stay withdrawn: the next call starts from the ledger
		}
		return ledgerFailure("record allocation decrease", err)
	}
	return nil
}

// giveBackWithdrawn returns up to n withdrawn units (n < 0: all) to the
// stock, while the ledger's allocation is still allocation, the one the
// caller read, and every recorded change is applied. Withdrawn units may
// belong to a decrease whose outcome was lost and that is still committing:
// given back beside it, they would be sold on top of the lowered allocation
// once it lands (ledger.WithAllocationSettled waits for it).
func (e *Engine) giveBackWithdrawn(ctx context.Context, allocation, n int64) error {
	// Most calls find nothing withdrawn: no lock on the campaign's row then.
	states, err := e.store.State(ctx)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(states, func(s stock.ShardState) bool { return s.Withdrawn != 0 }) {
		return nil
	}
	var gave error
	err = e.ledger.WithAllocationSettled(ctx, e.cfg.CampaignID, allocation, func() error {
		gave = e.returnWithdrawn(ctx, n)
		return gave
	})
	switch {
	case gave != nil, err == nil, errors.Is(err, ErrAllocationMoved):
		return err
	}
	return ledgerFailure("lock the allocation", err)
}

// returnWithdrawn puts up to n withdrawn units (n < 0: all) back into stock.
func (e *Engine) returnWithdrawn(ctx context.Context, n int64) error {
	states, err := e.store.State(ctx)
	if err != nil {
		return err
	}
	for _, s := range states {
		if s.Withdrawn == 0 || n == 0 {
			continue
		}
		give := s.Withdrawn
		if n > 0 {
			give = min(give, n)
			n -= give
		}
		if _, _, err := e.store.Withdraw(ctx, s.Index, 0, -give); err != nil {
			return err
		}
	}
	return nil
}
