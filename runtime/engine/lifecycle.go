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

// ErrNeedsRebuild means Redis does not hold what the ledger says it should (shards
// missing their meta, or a stale epoch): the shards must be rebuilt from the ledger,
// never seeded afresh.
var ErrNeedsRebuild = errors.New("redis lost campaign state: rebuild from the ledger required")

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
}

// Seed makes sure the ledger row exists and the shards are seeded, once. A shard that
// exists is never overwritten. Shards are seeded from scratch only by the call that
// creates the campaign's ledger row; any other gap returns ErrNeedsRebuild. Seeding
// over lost data would sell the sold units again, and even with no orders in the
// ledger a row still on its way would commit at the unchanged epoch: the rebuild
// bumps the epoch, so that row is counted or fenced.
func (e *Engine) Seed(ctx context.Context, gate string) (SeedResult, error) {
	return e.SeedSale(ctx, gate, false)
}

// SeedSale is Seed for a caller that knows whether the sale was seeded
// before: then a ledger without its campaign is ErrLedgerMismatch, as it is
// whenever Redis holds shards of a campaign the ledger does not know.
func (e *Engine) SeedSale(ctx context.Context, gate string, seededBefore bool) (SeedResult, error) {
	states, err := e.store.State(ctx)
	if err != nil {
		return SeedResult{}, fmt.Errorf("redis: %w", err)
	}
	present := 0
	for _, s := range states {
		if s.Present {
			present++
		}
	}
	c, err := e.ledger.GetCampaign(ctx, e.cfg.CampaignID)
	created := false
	switch {
	case errors.Is(err, ledger.ErrCampaignNotFound):
		if present > 0 || seededBefore {
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
		return SeedResult{}, ledgerFailure("campaign", err)
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
			return SeedResult{Campaign: c}, fmt.Errorf("%w: shards %s hold data written by another Redis server process (restarted from a snapshot, or a promoted replica): it may be older than the ledger", ErrNeedsRebuild, shardList(unverified))
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
// under the ledger's current epoch. Shards without meta are reported via
// ErrNeedsRebuild.
func (e *Engine) SetGate(ctx context.Context, state string, epoch int64) error {
	out, err := e.store.SetGate(ctx, state, epoch)
	if err != nil {
		return err
	}
	for i, n := range out {
		switch n {
		case stock.GateNoMeta:
			return fmt.Errorf("%w: shard %d has no meta", ErrNeedsRebuild, i)
		case stock.GateStale:
			return fmt.Errorf("%w: shard %d carries another epoch than %d", ErrNeedsRebuild, i, epoch)
		case stock.GateRebuilding:
			return fmt.Errorf("shard %d is being rebuilt", i)
		}
	}
	return nil
}

// ErrAllocationPending means a decrease could not finish yet: too few units are
// available right now (they are reserved). The withdrawn units stay out of stock
// and the next call continues.
var ErrAllocationPending = errors.New("allocation decrease pending")

// ErrBelowHeld refuses an allocation below the units sold and reserved.
var ErrBelowHeld = ledger.ErrBelowHeld

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
		if err := e.giveBackWithdrawn(ctx, -1); err != nil {
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
		if err := e.giveBackWithdrawn(ctx, -1); err != nil {
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
		if err := e.giveBackWithdrawn(ctx, -1); err != nil {
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
		if err := e.giveBackWithdrawn(ctx, withdrawn-need); err != nil {
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
			if gerr := e.giveBackWithdrawn(ctx, -1); gerr != nil {
				return errors.Join(err, gerr)
			}
			return err
		}
		return ledgerFailure("record allocation decrease", err)
	}
	return nil
}

// giveBackWithdrawn returns up to n withdrawn units (n < 0: all) to the stock.
func (e *Engine) giveBackWithdrawn(ctx context.Context, n int64) error {
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

// ShardCounts are one shard's numbers.
type ShardCounts struct {
	Index     int
	Present   bool
	State     string
	Epoch     int64
	Available int64 // Redis stock
	Reserved  int64 // Redis: units in reserved reservations
	Sold      int64 // ledger: committed units
	Pending   int64 // ledger: PENDING units
	Withdrawn int64 // Redis: units out of stock for an allocation decrease in progress
	// Allocation is the units the shard's meta says it was given (seed and
	// changes): what its own counts must add up to.
	Allocation int64
}

// Counts are the campaign's numbers for status and audits.
type Counts struct {
	Allocation int64 // ledger
	Epoch      int64 // ledger
	Available  int64
	Reserved   int64
	Sold       int64
	Pending    int64
	Withdrawn  int64
	Shards     []ShardCounts
}

// Unsold is the shard's reserved figure for status: the units of its
// allocation that are neither in Redis's stock nor sold in the ledger (nor
// withdrawn for a decrease). Each figure has one source (stock from Redis,
// sold from the ledger's counters) and reserved is the rest, so the three
// never add up to more than the allocation, even in the moment between a
// checkout's ledger commit and its Redis step, when Redis's own reserved
// counter still holds the unit. A shard Redis lost shows the ledger's
// pending units.
func (s ShardCounts) Unsold() int64 {
	if !s.Present {
		return s.Pending
	}
	return max(0, s.Allocation-s.Available-s.Sold-s.Withdrawn)
}

// Unsold sums the shards' Unsold.
func (c Counts) Unsold() int64 {
	var n int64
	for _, s := range c.Shards {
		n += s.Unsold()
	}
	return n
}

// Oversold is how many units are sold beyond the allocation (must be 0: I1).
func (c Counts) Oversold() int64 { return max(0, c.Sold-c.Allocation) }

// Conserved reports available + reserved + sold = allocation (I2, at quiescence;
// units withdrawn for a decrease in progress still belong to the allocation),
// for the campaign and for every shard on its own: a deficit on one shard
// could hide a surplus on another in the sum, and stock and the reserved
// counter move together in every script, so a unit released twice shows only
// against the shard's allocation.
func (c Counts) Conserved() bool {
	for _, s := range c.Shards {
		if s.Available < 0 || s.Reserved < 0 || s.Withdrawn < 0 ||
			s.Available+s.Reserved+s.Sold+s.Withdrawn != s.Allocation {
			return false
		}
	}
	return c.Available+c.Reserved+c.Sold+c.Withdrawn == c.Allocation
}

// Counts reads Redis (one pipeline) and the ledger (the campaign row and the
// shard counters: O(shards), whatever the number of orders).
func (e *Engine) Counts(ctx context.Context) (Counts, error) {
	states, err := e.store.State(ctx)
	if err != nil {
		return Counts{}, fmt.Errorf("redis: %w", err)
	}
	c, err := e.ledger.GetCampaign(ctx, e.cfg.CampaignID)
	if err != nil {
		return Counts{}, ledgerFailure("campaign", err)
	}
	byShard, err := e.ledger.CountsByShard(ctx, e.cfg.CampaignID, e.cfg.Shards)
	if err != nil {
		return Counts{}, ledgerFailure("counts", err)
	}
	out := Counts{Allocation: c.Allocation, Epoch: c.Epoch, Shards: make([]ShardCounts, len(states))}
	for i, s := range states {
		sc := ShardCounts{Index: i, Present: s.Present, State: s.State, Epoch: s.Epoch, Available: s.Available, Reserved: s.Reserved, Withdrawn: s.Withdrawn, Allocation: s.Allocation}
		if i < len(byShard) {
			sc.Sold, sc.Pending = byShard[i].Committed, byShard[i].Pending
		}
		out.Available += sc.Available
		out.Reserved += sc.Reserved
		out.Sold += sc.Sold
		out.Pending += sc.Pending
		out.Withdrawn += sc.Withdrawn
		out.Shards[i] = sc
	}
	return out, nil
}

// Health is what Check found in Redis.
type Health struct {
	Missing []int // shards without meta: Redis lost data
	Stale   []int // shards whose epoch differs from the ledger's
	// Unverified shards hold data written by another server process (restarted
	// from a snapshot, a promoted replica): possibly older than the ledger.
	Unverified []int
	RunIDs     map[string]string
}

// Lost reports whether Redis no longer holds the campaign's state.
func (h Health) Lost() bool { return len(h.Missing) > 0 || len(h.Stale) > 0 || len(h.Unverified) > 0 }

// Check compares every shard's meta with the ledger epoch. The caller compares RunIDs
// between calls too: a changed run id means the server restarted.
func (e *Engine) Check(ctx context.Context, epoch int64) (Health, error) {
	states, err := e.store.State(ctx)
	if err != nil {
		return Health{}, err
	}
	var h Health
	for _, s := range states {
		switch {
		case !s.Present:
			h.Missing = append(h.Missing, s.Index)
		case s.Epoch != epoch && s.State != stock.StateRebuilding:
			h.Stale = append(h.Stale, s.Index)
		}
	}
	h.Unverified = stock.Unverified(states)
	h.RunIDs, err = e.store.RunIDs(ctx)
	return h, err
}

// Delete closes the gates and removes every Redis key of the campaign, then marks
// the ledger campaign deleted. Orders stay: they are the book of record. A
// campaign the ledger never had (the sale was deleted before it was ever
// seeded) has nothing to mark.
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
	if _, err := e.store.DeleteAll(ctx); err != nil {
		return err
	}
	err = e.ledger.MarkCampaignDeleted(ctx, e.cfg.CampaignID)
	if err != nil && !errors.Is(err, ledger.ErrCampaignNotFound) {
		return ledgerFailure("mark campaign deleted", err)
	}
	return nil
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
