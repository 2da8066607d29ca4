package engine

import (
	"context"
	"fmt"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

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

// StockOversold tells which shard, if any, holds in Redis's stock units that
// the ledger already sold: available + sold above the shard's allocation, or
// stock below zero (I1). Unlike available + reserved + sold, it holds at every
// moment, not only at quiescence: a checkout commits the ledger before Redis
// drops its reservation, so for a moment a unit is both reserved and sold, but
// a sold unit never goes back to stock. Shards Redis does not hold are left
// out (their stock is gone); counts without shards are checked in total.
func (c Counts) StockOversold() error {
	if len(c.Shards) == 0 {
		if c.Available < 0 || c.Available+c.Sold > c.Allocation {
			return fmt.Errorf("available %d + sold %d exceeds the allocation %d", c.Available, c.Sold, c.Allocation)
		}
		return nil
	}
	for _, s := range c.Shards {
		if s.Present && (s.Available < 0 || s.Available+s.Sold > s.Allocation) {
			return fmt.Errorf("shard %d: available %d + sold %d exceeds its allocation %d", s.Index, s.Available, s.Sold, s.Allocation)
		}
	}
	return nil
}

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

// Counts reads the ledger (the campaign row and the shard counters: O(shards),
// whatever the number of orders), then Redis (one pipeline). In that order a
// unit reserved and sold between the two reads is counted once: sold units
// only grow and a sold unit never goes back to stock, so stock read after
// sold never adds up with it to more than the allocation (StockOversold).
// Read the other way, stock could still hold a unit that was sold by the time
// the ledger was read.
func (e *Engine) Counts(ctx context.Context) (Counts, error) {
	c, err := e.ledger.GetCampaign(ctx, e.cfg.CampaignID)
	if err != nil {
		return Counts{}, ledgerFailure("campaign", err)
	}
	byShard, err := e.ledger.CountsByShard(ctx, e.cfg.CampaignID, e.cfg.Shards)
	if err != nil {
		return Counts{}, ledgerFailure("counts", err)
	}
	if e.countsBetweenReads != nil {
		e.countsBetweenReads()
	}
	states, err := e.store.State(ctx)
	if err != nil {
		return Counts{}, fmt.Errorf("redis: %w", err)
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
