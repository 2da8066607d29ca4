package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Campaign is one flash sale's row, with its per-shard allocations.
type Campaign struct {
	ID               string
	Namespace        string
	Name             string
	SKU              string
	Allocation       int64
	Shards           int
	Epoch            int64
	ShardAllocations []int64 // indexed by shard
	LastChangeID     int64   // latest flashsale_allocation_changes row folded into the allocations
	CreatedAt        time.Time
	UpdatedAt        time.Time
	DeletedAt        *time.Time
}

const (
	// The shard allocations ride along as an array so a campaign is one round trip.
	campaignColumns = `c.campaign_id, c.namespace, c.name, c.sku, c.allocation, c.shards, c.epoch,
    ARRAY(SELECT s.allocation FROM flashsale_shards s WHERE s.campaign_id = c.campaign_id ORDER BY s.shard),
    c.last_change_id, c.created_at, c.updated_at, c.deleted_at`

	sqlGetCampaign = `SELECT ` + campaignColumns + ` FROM flashsale_campaigns c WHERE c.campaign_id = $1`

	sqlInsertCampaign = `INSERT INTO flashsale_campaigns (campaign_id, namespace, name, sku, allocation, shards, epoch)
VALUES ($1, $2, $3, $4, $5, $6, 1)
ON CONFLICT (campaign_id) DO NOTHING`

	sqlInsertShards = `INSERT INTO flashsale_shards (campaign_id, shard, allocation)
SELECT $1, t.shard, t.allocation FROM unnest($2::integer[], $3::bigint[]) AS t(shard, allocation)`

	sqlMarkCampaignDeleted = `UPDATE flashsale_campaigns
SET deleted_at = COALESCE(deleted_at, now()), updated_at = now()
WHERE campaign_id = $1`
)

// SplitAllocation divides total over shards: total/shards each, the remainder
// spread one unit at a time over the first shards.
func SplitAllocation(total int64, shards int) []int64 {
	if shards <= 0 {
		return nil
	}
	out := make([]int64, shards)
	base, rem := total/int64(shards), total%int64(shards)
	for i := range out {
		out[i] = base
		if int64(i) < rem {
			out[i]++
		}
	}
	return out
}

func scanCampaign(row pgx.Row) (Campaign, error) {
	var c Campaign
	err := row.Scan(&c.ID, &c.Namespace, &c.Name, &c.SKU, &c.Allocation, &c.Shards, &c.Epoch,
		&c.ShardAllocations, &c.LastChangeID, &c.CreatedAt, &c.UpdatedAt, &c.DeletedAt)
	return c, err
}

func getCampaign(ctx context.Context, q querier, id string) (Campaign, error) {
	c, err := scanCampaign(q.QueryRow(ctx, sqlGetCampaign, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Campaign{}, fmt.Errorf("%w: %s", ErrCampaignNotFound, id)
	}
	if err != nil {
		return Campaign{}, fmt.Errorf("ledger: get campaign %s: %w", id, err)
	}
	return c, nil
}

// EnsureCampaign inserts c at epoch 1, with its allocation split over its
// shards, unless a row with c.ID exists. Either way it returns the stored row;
// created says whether this call inserted it. An existing row is never
// changed (allocation changes go through PlanAllocationIncrease), so callers
// compare the returned row with what they asked for.
func (l *Ledger) EnsureCampaign(ctx context.Context, c Campaign) (Campaign, bool, error) {
	switch {
	case c.ID == "":
		return Campaign{}, false, errors.New("ledger: campaign without id")
	case c.Shards < 1:
		return Campaign{}, false, fmt.Errorf("ledger: campaign %s: shards %d < 1", c.ID, c.Shards)
	case c.Allocation < 0:
		return Campaign{}, false, fmt.Errorf("ledger: campaign %s: allocation %d < 0", c.ID, c.Allocation)
	}
	var stored Campaign
	var created bool
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		// A concurrent insert of the same id makes this wait for it and then
		// do nothing, so the shards below are written exactly once.
		tag, err := tx.Exec(ctx, sqlInsertCampaign, c.ID, c.Namespace, c.Name, c.SKU, c.Allocation, c.Shards)
		if err != nil {
			return err
		}
		if created = tag.RowsAffected() == 1; created {
			shards := make([]int32, c.Shards)
			for i := range shards {
				shards[i] = int32(i)
			}
			if _, err := tx.Exec(ctx, sqlInsertShards, c.ID, shards, SplitAllocation(c.Allocation, c.Shards)); err != nil {
				return err
			}
		}
		stored, err = getCampaign(ctx, tx, c.ID)
		return err
	})
	if err != nil {
		return Campaign{}, false, fmt.Errorf("ledger: ensure campaign %s: %w", c.ID, err)
	}
	return stored, created, nil
}

// GetCampaign returns the campaign, deleted or not, or ErrCampaignNotFound.
func (l *Ledger) GetCampaign(ctx context.Context, id string) (Campaign, error) {
	return getCampaign(ctx, l.pool, id)
}

// MarkCampaignDeleted sets deleted_at (once; repeated calls keep the first
// time). Orders stay: they are the record of what was sold. New PENDING rows
// for a deleted campaign are fenced.
func (l *Ledger) MarkCampaignDeleted(ctx context.Context, id string) error {
	tag, err := l.pool.Exec(ctx, sqlMarkCampaignDeleted, id)
	if err != nil {
		return fmt.Errorf("ledger: delete campaign %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s", ErrCampaignNotFound, id)
	}
	return nil
}
