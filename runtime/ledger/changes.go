package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Change is one planned allocation increase (restock). The ledger's
// allocations include it as soon as it is planned; AppliedAt is set once
// Redis holds the added units.
type Change struct {
	ID             int64
	CampaignID     string
	FromAllocation int64
	ToAllocation   int64
	ShardDeltas    []int64 // units added to each shard, indexed by shard
	CreatedAt      time.Time
	AppliedAt      *time.Time
}

const (
	sqlLockCampaignAllocation = `SELECT allocation, shards, deleted_at IS NOT NULL, epoch
FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE`

	sqlShardAllocations = `SELECT allocation FROM flashsale_shards WHERE campaign_id = $1 ORDER BY shard`

	sqlInsertChange = `INSERT INTO flashsale_allocation_changes (campaign_id, from_allocation, to_allocation, shard_deltas)
VALUES ($1, $2, $3, $4)
RETURNING change_id, created_at`

	sqlAddShardAllocations = `UPDATE flashsale_shards s SET allocation = s.allocation + d.delta
FROM unnest($2::bigint[]) WITH ORDINALITY AS d(delta, ord)
WHERE s.campaign_id = $1 AND s.shard = d.ord - 1`

	sqlSetAllocation = `UPDATE flashsale_campaigns SET allocation = $2, last_change_id = $3, updated_at = now()
WHERE campaign_id = $1`

	changeColumns = `change_id, campaign_id, from_allocation, to_allocation, shard_deltas, created_at, applied_at`

	sqlUnappliedChanges = `SELECT ` + changeColumns + ` FROM flashsale_allocation_changes
WHERE campaign_id = $1 AND applied_at IS NULL ORDER BY change_id`

	sqlCampaignEpoch = `SELECT epoch FROM flashsale_campaigns WHERE campaign_id = $1`

	sqlMarkChangeApplied = `UPDATE flashsale_allocation_changes SET applied_at = COALESCE(applied_at, now())
WHERE change_id = $1`
)

// spreadDelta splits delta over shards: delta/shards each and the remainder
// one unit at a time starting at shard start, wrapping around. Starting where
// SplitAllocation(old) stopped handing out its remainder (old % shards) keeps
// the shards as even as SplitAllocation(new) would have made them.
func spreadDelta(delta int64, shards, start int) []int64 {
	out := make([]int64, shards)
	base, rem := delta/int64(shards), delta%int64(shards)
	for i := range out {
		out[i] = base
	}
	for k := range int(rem) {
		out[(start+k)%shards]++
	}
	return out
}

// PlanAllocationIncrease records a restock to newAllocation, exactly once: in
// one transaction with the campaign row locked it adds the per-shard deltas to
// flashsale_shards, raises the campaign's allocation and last_change_id, and
// inserts the change for Redis to apply. A second call with the same target
// finds nothing to do and returns false. Decreases are refused
// (ErrAllocationDecrease).
func (l *Ledger) PlanAllocationIncrease(ctx context.Context, campaignID string, newAllocation int64) (Change, bool, error) {
	var ch Change
	var planned bool
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var current, now int64 // now: the epoch, unused here
		var shards int
		var deleted bool
		if err := tx.QueryRow(ctx, sqlLockCampaignAllocation, campaignID).Scan(&current, &shards, &deleted, &now); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: %s", ErrCampaignNotFound, campaignID)
			}
			return err
		}
		switch {
		case deleted:
			return fmt.Errorf("%w: %s is deleted", ErrCampaignNotFound, campaignID)
		case newAllocation == current:
			return nil
		case newAllocation < current:
			return fmt.Errorf("%w: %d → %d", ErrAllocationDecrease, current, newAllocation)
		}
		// The shards may already differ from SplitAllocation(current) after
		// earlier changes; only the delta is spread, on top of what they hold.
		rows, err := tx.Query(ctx, sqlShardAllocations, campaignID)
		if err != nil {
			return err
		}
		have, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if len(have) != shards {
			return fmt.Errorf("campaign has %d shards but %d shard rows", shards, len(have))
		}
		deltas := spreadDelta(newAllocation-current, shards, int(current%int64(shards)))
		ch = Change{CampaignID: campaignID, FromAllocation: current, ToAllocation: newAllocation, ShardDeltas: deltas}
		if err := tx.QueryRow(ctx, sqlInsertChange, campaignID, current, newAllocation, deltas).Scan(&ch.ID, &ch.CreatedAt); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlAddShardAllocations, campaignID, deltas); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlSetAllocation, campaignID, newAllocation, ch.ID); err != nil {
			return err
		}
		planned = true
		return nil
	})
	if err != nil {
		return Change{}, false, fmt.Errorf("ledger: plan allocation %s: %w", campaignID, err)
	}
	if !planned {
		return Change{}, false, nil
	}
	return ch, true, nil
}

// UnappliedChanges lists the campaign's changes that Redis does not hold
// yet, oldest first, with the campaign's epoch read from the same snapshot.
// A change applied under that epoch is safe. The rebuild's epoch bump and
// the recording of a change both lock the campaign row, so a change listed
// here either committed before the bump, and the rebuild absorbs it into
// its own snapshot, or after it, and then the snapshot holds the bump too:
// shards the rebuild has not rewritten yet refuse that epoch. An epoch read
// earlier, apart from the changes, could predate a rebuild whose snapshot
// misses a change listed here; the shards the rebuild had not reached would
// take the change, and the rebuild would then overwrite it.
func (l *Ledger) UnappliedChanges(ctx context.Context, campaignID string) (int64, []Change, error) {
	var epoch int64
	var out []Change
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, sqlCampaignEpoch, campaignID).Scan(&epoch); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: %s", ErrCampaignNotFound, campaignID)
			}
			return err
		}
		rows, err := tx.Query(ctx, sqlUnappliedChanges, campaignID)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Change, error) {
			var c Change
			err := r.Scan(&c.ID, &c.CampaignID, &c.FromAllocation, &c.ToAllocation, &c.ShardDeltas, &c.CreatedAt, &c.AppliedAt)
			return c, err
		})
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("ledger: unapplied changes %s: %w", campaignID, err)
	}
	return epoch, out, nil
}

// MarkChangeApplied records that Redis holds the change's units. Repeating it
// keeps the first time. An unknown id is ErrNotFound.
func (l *Ledger) MarkChangeApplied(ctx context.Context, changeID int64) error {
	tag, err := l.pool.Exec(ctx, sqlMarkChangeApplied, changeID)
	if err != nil {
		return fmt.Errorf("ledger: mark change %d applied: %w", changeID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: change %d", ErrNotFound, changeID)
	}
	return nil
}

// ErrBelowHeld refuses an allocation below the units already sold or reserved.
var ErrBelowHeld = errors.New("allocation below the units sold and reserved")

// From the counters (0002_shard_counts), not the orders: O(shards).
const sqlHeldUnits = `SELECT coalesce(sum(pending + committed), 0)::bigint FROM flashsale_shard_counts
WHERE campaign_id = $1`

// ErrEpochChanged refuses a decrease whose units were withdrawn under an
// epoch a rebuild has replaced since: the rebuild put them back into stock.
var ErrEpochChanged = errors.New("the campaign was rebuilt since the units were withdrawn")

// RecordAllocationDecrease records a decrease from → to whose units Redis has
// already withdrawn from stock, shardDeltas (≤ 0) per shard, under epoch. In one
// transaction with the campaign row locked it checks that the allocation is
// still from, the epoch still epoch (ErrEpochChanged otherwise), and that the
// committed and pending units fit in to (ErrBelowHeld otherwise), then lowers
// the shard allocations and the campaign's. The change stays unapplied until
// Redis settles it (the withdrawn units become the shards' new allocation).
func (l *Ledger) RecordAllocationDecrease(ctx context.Context, campaignID string, epoch, from, to int64, shardDeltas []int64) (Change, error) {
	ch := Change{CampaignID: campaignID, FromAllocation: from, ToAllocation: to, ShardDeltas: shardDeltas}
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var current, now int64 // now: the campaign's epoch
		var shards int
		var deleted bool
		if err := tx.QueryRow(ctx, sqlLockCampaignAllocation, campaignID).Scan(&current, &shards, &deleted, &now); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: %s", ErrCampaignNotFound, campaignID)
			}
			return err
		}
		var sum int64
		for _, d := range shardDeltas {
			if d > 0 {
				return fmt.Errorf("a decrease cannot add %d units to a shard", d)
			}
			sum += d
		}
		switch {
		case deleted:
			return fmt.Errorf("%w: %s is deleted", ErrCampaignNotFound, campaignID)
		case now != epoch:
			return fmt.Errorf("%w: epoch %d, the units were withdrawn under %d", ErrEpochChanged, now, epoch)
		case current != from:
			return fmt.Errorf("%w: allocation %d, not %d", ErrAllocationMoved, current, from)
		case to >= from || to < 0:
			return fmt.Errorf("%d → %d is not a decrease", from, to)
		case len(shardDeltas) != shards:
			return fmt.Errorf("%d shard deltas for %d shards", len(shardDeltas), shards)
		case from+sum != to:
			return fmt.Errorf("shard deltas remove %d units, not %d", -sum, from-to)
		}
		var held int64
		if err := tx.QueryRow(ctx, sqlHeldUnits, campaignID).Scan(&held); err != nil {
			return err
		}
		if held > to {
			return fmt.Errorf("%w: %d units sold or reserved, allocation %d asked", ErrBelowHeld, held, to)
		}
		if err := tx.QueryRow(ctx, sqlInsertChange, campaignID, from, to, shardDeltas).Scan(&ch.ID, &ch.CreatedAt); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlAddShardAllocations, campaignID, shardDeltas); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlSetAllocation, campaignID, to, ch.ID)
		return err
	})
	if err != nil {
		return Change{}, fmt.Errorf("ledger: record allocation decrease %s: %w", campaignID, err)
	}
	return ch, nil
}

// ErrAllocationMoved: the allocation is no longer the one read before, or a
// recorded change is not applied yet; the caller starts over from the ledger.
var ErrAllocationMoved = errors.New("the allocation changed meanwhile")

// rollbackTimeout bounds WithAllocationSettled's rollback.
const rollbackTimeout = 5 * time.Second

const sqlShareCampaignAllocation = `SELECT allocation,
  EXISTS (SELECT 1 FROM flashsale_allocation_changes WHERE campaign_id = $1 AND applied_at IS NULL)
FROM flashsale_campaigns WHERE campaign_id = $1 FOR SHARE`

// WithAllocationSettled calls fn with the campaign's row share-locked, and
// only if the allocation is still allocation and every recorded change is
// applied (ErrAllocationMoved otherwise, fn not called). fn's error is
// returned as it is.
//
// Units withdrawn in Redis for a decrease are the decrease's once it
// commits, and a decrease whose outcome was lost may still be committing (a
// COMMIT waiting for a synchronous standby holds the row lock and is seen
// by no one). Giving such units back to the stock is safe only under this
// lock: it waits for that transaction to end, then re-reads the row, whose
// allocation every recorded change moves (the EXISTS below keeps the
// snapshot taken before the wait, so it is the allocation that tells). The transaction is rolled back: it writes nothing, and a
// rollback does not wait for a standby.
func (l *Ledger) WithAllocationSettled(ctx context.Context, campaignID string, allocation int64, fn func() error) error {
	tx, err := l.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return fmt.Errorf("ledger: lock allocation %s: %w", campaignID, err)
	}
	defer func() {
		// Bounded: on a link gone silent the rollback would wait for TCP.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	var current int64
	var unapplied bool
	if err := tx.QueryRow(ctx, sqlShareCampaignAllocation, campaignID).Scan(&current, &unapplied); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("ledger: lock allocation: %w: %s", ErrCampaignNotFound, campaignID)
		}
		return fmt.Errorf("ledger: lock allocation %s: %w", campaignID, err)
	}
	switch {
	case current != allocation:
		return fmt.Errorf("%w: allocation %d, read as %d before", ErrAllocationMoved, current, allocation)
	case unapplied:
		return fmt.Errorf("%w: a recorded change is not applied yet", ErrAllocationMoved)
	}
	return fn()
}
