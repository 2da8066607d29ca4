package engine

import (
	"context"
	"errors"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// PayingHold is how long the sweep keeps a paying mark (stock.MarkPaying)
// whose ledger row is still PENDING: far longer than a checkout's ledger call
// takes, so that a commit landing late is still settled on the next pass.
// After that, or at once when the row is neither PENDING nor COMMITTED, the
// mark goes: that checkout did not commit, and the reservation is the sweep's
// as any other.
const PayingHold = time.Minute

// settlePaying settles the reservations of shard that a checkout marked as
// being paid and did not settle in Redis (its process died, or lost Redis,
// between its ledger commit and its Redis step): each the ledger has
// COMMITTED is marked committed now, so its unit stops counting as reserved
// on the pass after the checkout, not after its expiry and grace. It returns
// how many it settled, and whether the pass's budget ran out first.
func (e *Engine) settlePaying(ctx context.Context, shard int, now time.Time) (settled int, more bool, err error) {
	offset, dropped := 0, 0
	for batch := 1; ; batch++ {
		entries, err := e.store.PayingEntries(ctx, shard, offset, SweepBatch)
		if err != nil || len(entries) == 0 {
			return settled, false, err
		}
		before := settled + dropped
		for _, p := range entries {
			o, err := e.ledger.GetOrder(ctx, e.cfg.CampaignID, stock.FormatID(shard, p.Key))
			missing := errors.Is(err, ledger.ErrNotFound)
			if err != nil && !missing {
				return settled, false, err
			}
			switch {
			case !missing && o.Status == ledger.StatusCommitted:
				// commit.lua takes the mark away with the reservation.
				n, err := e.store.MarkCommitted(ctx, shard, p.Key)
				if err == nil && n == stock.CommitLedgerNeeded {
					n, err = e.markCommittedFromLedger(ctx, shard, p.Key)
				}
				if err != nil {
					return settled, false, err
				}
				if n == stock.CommitRebuilding {
					offset++ // the mark stays for a pass after the rebuild
					continue
				}
				settled++
			case !missing && o.Status == ledger.StatusPending && now.Sub(time.UnixMilli(p.AtMs)) < PayingHold:
				offset++ // being paid now, or given up a moment ago
			default:
				if _, err := e.store.DropPaying(ctx, shard, p.Key, p.AtMs); err != nil {
					return settled, false, err
				}
				dropped++
			}
		}
		if len(entries) < SweepBatch {
			return settled, false, nil
		}
		if batch == e.batchBudget() {
			// Another pass at once only if the last batch changed something
			// (see reapClaims).
			return settled, settled+dropped > before, nil
		}
	}
}
