package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// ErrNeedsRebuild means Redis does not hold what the ledger says it should (shards
// missing their meta, or a stale epoch): the shards must be rebuilt from the ledger,
// never seeded afresh.
var ErrNeedsRebuild = errors.New("redis lost campaign state: rebuild from the ledger required")

// ErrFailedClosed (with ErrNeedsRebuild) means shards were failed closed on a
// loss and not rebuilt since: the rebuild is due, whatever the ledger
// recorded of the loss.
var ErrFailedClosed = errors.New("failed closed and not rebuilt since")

// ErrLedgerMismatch means the ledger has no record of a sale that was seeded
// before (Redis holds its shards, or the caller knows it ran): the ledger's
// DSN now points at another database, or the ledger lost data. Nothing is
// created: a second book at epoch 1 would let a later rebuild sell the sold
// units again.
var ErrLedgerMismatch = errors.New("the ledger has no record of this sale")

// SeedResult says what Seed did.
type SeedResult struct {
	Campaign ledger.Campaign
	Seeded   int  // shards written now
	Live     bool // every shard was already live: nothing written
	// Missing is how many of the Shards shards had no meta, as read before
	// the ledger failed to answer: a caller can tell a loss of Redis's data
	// while the ledger is down (the rebuild waits for the ledger).
	Missing, Shards int
}

// Seed makes sure the ledger row exists and the shards are seeded, once. A shard that
// exists is never overwritten. Shards are seeded from scratch only by the call that
// creates the campaign's ledger row; any other gap returns ErrNeedsRebuild. Seeding
// over lost data would sell the sold units again, and even with no orders in the
// ledger a row still on its way would commit at the unchanged epoch: the rebuild
// bumps the epoch, so that row is counted or fenced.
func (e *Engine) Seed(ctx context.Context, gate string) (SeedResult, error) {
	return e.SeedSale(ctx, gate, nil)
}

// SetUpBefore answers whether the sale was set up before, from what the
// caller can see of it outside Redis and the ledger. SeedSale asks it only
// when neither store holds the campaign.
type SetUpBefore func(context.Context) (bool, error)

// SeedSale is Seed for a caller that can tell whether the sale was set up
// before (nil: it cannot): then a ledger without its campaign is
// ErrLedgerMismatch, as it is whenever Redis holds shards of a campaign the
// ledger does not know.
func (e *Engine) SeedSale(ctx context.Context, gate string, setUpBefore SetUpBefore) (SeedResult, error) {
	states, err := e.store.State(ctx)
	if err != nil {
		return SeedResult{}, fmt.Errorf("redis: %w", err)
	}
	present := presentShards(states)
	c, err := e.ledger.GetCampaign(ctx, e.cfg.CampaignID)
	created := false
	switch {
	case errors.Is(err, ledger.ErrCampaignNotFound):
		before := present > 0
		if !before && setUpBefore != nil {
			if before, err = setUpBefore(ctx); err != nil {
				return SeedResult{}, err
			}
		}
		if before {
			return SeedResult{}, fmt.Errorf("%w, though it was seeded before (Redis holds %d of its %d shards): the ledger DSN points at another database, or the ledger lost data; nothing is seeded or rebuilt",
				ErrLedgerMismatch, present, len(states))
		}
		// A new sale: nothing is written, not even the ledger's campaign,
		// where its keys may be evicted (stock.ErrEvictionPolicy). A live
		// sale that lost shards goes on to fail closed; its rebuild checks.
		if err := e.store.CheckEviction(ctx); err != nil {
			return SeedResult{}, fmt.Errorf("redis: %w", err)
		}
		c, created, err = e.ledger.EnsureCampaign(ctx, ledger.Campaign{
			ID: e.cfg.CampaignID, Namespace: e.cfg.Namespace, Name: e.cfg.Name, SKU: e.cfg.SKU,
			Allocation: e.cfg.Allocation, Shards: e.cfg.Shards,
		})
		if err != nil {
			return SeedResult{}, ledgerFailure("campaign", err)
		}
	case err != nil:
		return SeedResult{Missing: len(states) - present, Shards: len(states)}, ledgerFailure("campaign", err)
	}
	if c.Shards != e.cfg.Shards {
		return SeedResult{}, fmt.Errorf("the ledger has %d shards for this campaign, not %d", c.Shards, e.cfg.Shards)
	}
	e.seeEpoch(c.Epoch)
	for _, s := range states {
		if s.Present && s.Epoch != c.Epoch {
			return SeedResult{Campaign: c}, fmt.Errorf("%w: shard %d has epoch %d, the ledger %d", ErrNeedsRebuild, s.Index, s.Epoch, c.Epoch)
		}
	}
	if present == len(states) {
		// A rebuild cut short (its process died) leaves shards REBUILDING at
		// the ledger's epoch: nothing else would ever finish them.
		if i := slices.IndexFunc(states, func(s stock.ShardState) bool { return s.State == stock.StateRebuilding }); i >= 0 {
			return SeedResult{Campaign: c}, fmt.Errorf("%w: shard %d was left being rebuilt", ErrNeedsRebuild, i)
		}
		if unverified := stock.Unverified(states); len(unverified) > 0 {
			return SeedResult{Campaign: c}, fmt.Errorf("%w: shards %s hold data written by another Redis server process or replication history (restarted from a snapshot, a promoted replica, or a master promoted back): it may be older than the ledger", ErrNeedsRebuild, shardList(unverified))
		}
		// Only a loss fails a shard closed, and a rebuild is what opens it
		// again: opened as it is (the loss's record lost with a ledger
		// that did not answer), it would sell from the data the loss made
		// suspect, which a failback may since have made look verified.
		if closed := failedClosed(states); len(closed) > 0 {
			return SeedResult{Campaign: c}, fmt.Errorf("%w: %w: shards %s", ErrNeedsRebuild, ErrFailedClosed, shardList(closed))
		}
		return SeedResult{Campaign: c, Live: true}, nil
	}
	if present > 0 || !created {
		return SeedResult{Campaign: c}, fmt.Errorf("%w: %d of %d shards missing (lost, or never seeded by the call that created the campaign)", ErrNeedsRebuild, len(states)-present, len(states))
	}
	// Refuse unsupported servers before writing any shard (stock.ErrRedisTooOld).
	if _, err := e.store.RunIDs(ctx); err != nil {
		return SeedResult{}, fmt.Errorf("redis: %w", err)
	}
	res := SeedResult{Campaign: c}
	for i, units := range c.ShardAllocations {
		ok, err := e.store.Seed(ctx, i, units, c.Epoch, gate, c.LastChangeID)
		if err != nil {
			return res, err
		}
		if ok {
			res.Seeded++
		}
	}
	return res, nil
}

// SetGate writes the gate state (OPEN, NOT_STARTED, PAUSED, ENDED) of every shard
// under the ledger's current epoch. Shards without meta, and shards failed
// closed (ErrFailedClosed too), are reported via ErrNeedsRebuild.
func (e *Engine) SetGate(ctx context.Context, state string, epoch int64) error {
	out, err := e.store.SetGate(ctx, state, epoch)
	if err != nil {
		return err
	}
	return gateOutcome(out, epoch)
}

// gateOutcome is the error of SetGate's per-shard outcomes.
func gateOutcome(out []int, epoch int64) error {
	for i, n := range out {
		switch n {
		case stock.GateNoMeta:
			return fmt.Errorf("%w: shard %d has no meta", ErrNeedsRebuild, i)
		case stock.GateStale:
			return fmt.Errorf("%w: shard %d carries another epoch than %d", ErrNeedsRebuild, i, epoch)
		case stock.GateRebuilding:
			return fmt.Errorf("shard %d is being rebuilt", i)
		case stock.GateFailedClosed:
			return fmt.Errorf("%w: %w: shard %d", ErrNeedsRebuild, ErrFailedClosed, i)
		}
	}
	return nil
}

// Delete closes the gates and removes every Redis key of the campaign, then marks
// the ledger campaign deleted. Orders stay: they are the book of record. A
// campaign the ledger never had (the sale was deleted before it was ever
// seeded) has nothing to mark. A ledger without the campaign while Redis holds
// its shards is ErrLedgerMismatch: the ledger that does hold it would keep a
// live campaign and pending orders nobody sweeps, so nothing is deleted.
func (e *Engine) Delete(ctx context.Context) error {
	// Marked deleted only after its keys were: a deletion retried (the
	// children's deletion failed) does not scan a big shared Redis again.
	// Closed first: that needs Redis alone, and the ledger may hang.
	_, gerr := e.store.SetGate(ctx, stock.StateEnded, 0)
	c, err := e.ledger.GetCampaign(ctx, e.cfg.CampaignID)
	if err == nil && c.DeletedAt != nil {
		return nil
	}
	if gerr != nil {
		return gerr
	}
	if err != nil && !errors.Is(err, ledger.ErrCampaignNotFound) {
		// Closed, and the keyspace scan waits for the ledger: every retry
		// of a deletion that cannot mark the campaign would scan it again.
		return ledgerFailure("read campaign", err)
	}
	if err != nil { // not found
		states, serr := e.store.State(ctx)
		if serr != nil {
			return fmt.Errorf("redis: %w", serr)
		}
		if present := presentShards(states); present > 0 {
			return fmt.Errorf("%w, though Redis holds %d of its %d shards: the ledger DSN points at another database, or the ledger lost data; the sale is ended, and its keys and campaign are left for the ledger that holds it",
				ErrLedgerMismatch, present, len(states))
		}
	}
	if _, err := e.store.DeleteAll(ctx); err != nil {
		return err
	}
	err = e.ledger.MarkCampaignDeleted(ctx, e.cfg.CampaignID)
	if err != nil && !errors.Is(err, ledger.ErrCampaignNotFound) {
		return ledgerFailure("mark campaign deleted", err)
	}
	return nil
}

// failedClosed lists the shards whose gate is FAIL_CLOSED.
func failedClosed(states []stock.ShardState) []int {
	var out []int
	for _, s := range states {
		if s.Present && s.State == stock.StateFailClosed {
			out = append(out, s.Index)
		}
	}
	return out
}

// presentShards counts the shards Redis holds a meta of.
func presentShards(states []stock.ShardState) int {
	n := 0
	for _, s := range states {
		if s.Present {
			n++
		}
	}
	return n
}

// shardList names shards in a message, the first few only: a sale may have a
// thousand, and the message goes into the FlashSale's conditions and events.
func shardList(idx []int) string {
	const shown = 8
	if len(idx) <= shown {
		return fmt.Sprint(idx)
	}
	return fmt.Sprintf("%v and %d more", idx[:shown], len(idx)-shown)
}
