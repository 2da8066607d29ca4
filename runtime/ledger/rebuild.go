package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// RebuildSnapshot is what BeginRebuild did; ReadRebuild then reads what
// Redis must hold.
type RebuildSnapshot struct {
	Campaign      Campaign // with the new epoch
	PreviousEpoch int64
	// Expired counts PENDING rows past expires_at + grace that this rebuild
	// cancelled as CANCELLED_BY_SWEEPER (Redis lost them; nothing to release).
	Expired int
}

const (
	sqlLockCampaign = `SELECT campaign_id FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE`

	sqlBumpEpoch = `UPDATE flashsale_campaigns SET epoch = epoch + 1, updated_at = now()
WHERE campaign_id = $1 AND deleted_at IS NULL
RETURNING epoch - 1`

	// Locked in reservation id order, as the sweeper's cancel does, so the
	// two cannot deadlock, and updated through the primary key as it does.
	sqlCancelExpiredAll = `UPDATE flashsale_orders
SET status = 'CANCELLED_BY_SWEEPER', updated_at = now()
WHERE campaign_id = (SELECT $1::text) AND status = 'PENDING' AND request_key = ANY (ARRAY(
    SELECT request_key FROM flashsale_orders
    WHERE campaign_id = (SELECT $1::text) AND status = 'PENDING' AND expires_at + $2::bigint * interval '1 microsecond' < now()
    ORDER BY reservation_id
    FOR UPDATE))`

	// The shard allocations include every planned change up to
	// last_change_id, so the rebuilt stock already holds those units.
	sqlAbsorbChanges = `UPDATE flashsale_allocation_changes SET applied_at = now()
WHERE campaign_id = $1 AND applied_at IS NULL AND change_id <= $2`

	sqlCountsByShard = `SELECT shard, sum(pending)::bigint, sum(committed)::bigint FROM flashsale_shard_counts
WHERE campaign_id = $1
GROUP BY shard`
)

// BeginRebuild bumps the campaign's epoch and cancels the expired pending
// orders, in one READ COMMITTED transaction with the campaign row locked FOR
// UPDATE. A materializer batch holds FOR SHARE on that row while it checks the
// epoch and inserts, so each batch either committed before the lock was
// granted, and any snapshot taken after this returns (ReadRebuild's) sees its
// rows, or it waits and then sees the new epoch and is fenced.
//
// Unapplied allocation changes up to the campaign's last_change_id are marked
// applied in the same transaction: the snapshot's shard allocations already
// contain them, and applying them again to the rebuilt Redis would oversell.
func (l *Ledger) BeginRebuild(ctx context.Context, campaignID string, grace time.Duration) (RebuildSnapshot, error) {
	if grace < 0 {
		grace = 0
	}
	l.ensureStatistics(ctx)
	var snap RebuildSnapshot
	// Must stay READ COMMITTED: under REPEATABLE READ the cancel would use the
	// snapshot from before the lock wait and miss batches that committed
	// during it.
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		// Its cancel of the expired orders scans the campaign's pending ones
		// and waits for their row locks: a database's or role's time limit
		// would fail it at every retry, and keep the sale closed.
		if _, err := tx.Exec(ctx, sqlUntimedTx); err != nil {
			return err
		}
		var id string
		if err := tx.QueryRow(ctx, sqlLockCampaign, campaignID).Scan(&id); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: %s", ErrCampaignNotFound, campaignID)
			}
			return err
		}
		if err := tx.QueryRow(ctx, sqlBumpEpoch, campaignID).Scan(&snap.PreviousEpoch); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: %s is deleted", ErrCampaignNotFound, campaignID)
			}
			return err
		}
		tag, err := tx.Exec(ctx, sqlCancelExpiredAll, campaignID, grace.Microseconds())
		if err != nil {
			return err
		}
		snap.Expired = int(tag.RowsAffected())
		if snap.Campaign, err = getCampaign(ctx, tx, campaignID); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, sqlAbsorbChanges, campaignID, snap.Campaign.LastChangeID)
		return err
	})
	if err != nil {
		return RebuildSnapshot{}, fmt.Errorf("ledger: rebuild %s: %w", campaignID, err)
	}
	return snap, nil
}

// ShardCounts are units (sum of quantity) held in one shard.
type ShardCounts struct {
	Committed int64
	Pending   int64 // includes expired rows the sweeper has not cancelled yet: Redis still holds them
}

// CountsByShard reads the per-shard counters (0002_shard_counts): a few rows
// per shard, whatever the number of orders, so it is cheap to run every few
// seconds. It never reads an order row.
func (l *Ledger) CountsByShard(ctx context.Context, campaignID string, shards int) ([]ShardCounts, error) {
	return countsByShard(ctx, l.pool, campaignID, shards)
}

func countsByShard(ctx context.Context, q querier, campaignID string, shards int) ([]ShardCounts, error) {
	if shards < 1 {
		return nil, fmt.Errorf("ledger: counts %s: shards %d < 1", campaignID, shards)
	}
	out := make([]ShardCounts, shards)
	rows, err := q.Query(ctx, sqlCountsByShard, campaignID)
	if err != nil {
		return nil, fmt.Errorf("ledger: counts %s: %w", campaignID, err)
	}
	var shard int
	var pending, committed int64
	_, err = pgx.ForEachRow(rows, []any{&shard, &pending, &committed}, func() error {
		if shard < 0 || shard >= shards {
			if pending == 0 && committed == 0 {
				return nil
			}
			return fmt.Errorf("units in shard %d, campaign has %d shards", shard, shards)
		}
		out[shard] = ShardCounts{Committed: committed, Pending: pending}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: counts %s: %w", campaignID, err)
	}
	return out, nil
}
