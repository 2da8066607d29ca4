package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Holder is one buyer's units in PENDING and COMMITTED orders of a campaign:
// what the per-user limit must count after a rebuild.
type Holder struct {
	UserID string
	Units  int64
}

// RebuildReader receives what ReadRebuild streams. Each call gets at most
// Batch items; a slice is reused after the call returns, so a reader that keeps
// items copies them. An error stops the read and is returned.
type RebuildReader struct {
	Batch int // default 1000
	// Pending gets every PENDING order of the campaign, in shard order,
	// with what a rebuild restores: the reservation id, user, shard,
	// quantity, epoch, expiry and creation time (its campaign and status are
	// known; its SKU, payment token and update time are left empty).
	Pending func(ctx context.Context, orders []Order) error
	// Holders gets every buyer holding units, in no particular order.
	Holders func(ctx context.Context, holders []Holder) error
}

const defaultRebuildBatch = 1000

const (
	// Only the columns a rebuild restores: every column scanned costs the
	// rebuild's CPU once per pending order.
	sqlPendingOrders = `SELECT reservation_id, user_id, shard, quantity, epoch, expires_at, created_at FROM flashsale_orders
WHERE campaign_id = $1 AND status = 'PENDING'
ORDER BY shard`

	sqlHolders = `SELECT user_id, sum(quantity)::bigint FROM flashsale_orders
WHERE campaign_id = $1 AND status IN ('PENDING', 'COMMITTED')
GROUP BY user_id`
)

// ErrCountsDrift means the per-shard counters disagree with the orders they
// count. Nothing is rebuilt from a ledger that contradicts itself.
var ErrCountsDrift = errors.New("ledger: shard counters disagree with the orders")

// ReadRebuild reads what a rebuild must write to Redis, after BeginRebuild
// has bumped the epoch: the pending orders and the buyers' holdings, streamed
// in batches, and per shard the committed units (from the counters) and the
// pending units (summed from the streamed orders, and checked against the
// counters). Everything comes from one REPEATABLE READ snapshot, so a
// checkout or a cancel running meanwhile is seen either entirely or not at
// all: the counts and the orders agree. Memory stays at one batch whatever
// the number of orders.
func (l *Ledger) ReadRebuild(ctx context.Context, campaignID string, shards int, r RebuildReader) ([]ShardCounts, error) {
	if shards < 1 {
		return nil, fmt.Errorf("ledger: read rebuild %s: shards %d < 1", campaignID, shards)
	}
	batch := r.Batch
	if batch <= 0 {
		batch = defaultRebuildBatch
	}
	var out []ShardCounts
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		counted, err := countsByShard(ctx, tx, campaignID, shards)
		if err != nil {
			return err
		}
		out = make([]ShardCounts, shards)
		for i := range out {
			out[i].Committed = counted[i].Committed
		}
		if err := streamPending(ctx, tx, campaignID, shards, batch, out, r.Pending); err != nil {
			return err
		}
		for i := range out {
			if out[i].Pending != counted[i].Pending {
				return fmt.Errorf("%w: shard %d counts %d pending units, its orders hold %d", ErrCountsDrift, i, counted[i].Pending, out[i].Pending)
			}
		}
		return streamHolders(ctx, tx, campaignID, batch, r.Holders)
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: read rebuild %s: %w", campaignID, err)
	}
	return out, nil
}

func streamPending(ctx context.Context, tx pgx.Tx, campaignID string, shards, batch int, sums []ShardCounts, fn func(context.Context, []Order) error) error {
	rows, err := tx.Query(ctx, sqlPendingOrders, campaignID)
	if err != nil {
		return err
	}
	defer rows.Close()
	buf := make([]Order, 0, batch)
	flush := func() error {
		if len(buf) == 0 || fn == nil {
			buf = buf[:0]
			return nil
		}
		err := fn(ctx, buf)
		buf = buf[:0]
		return err
	}
	for rows.Next() {
		o := Order{CampaignID: campaignID, Status: StatusPending}
		if err := rows.Scan(&o.ReservationID, &o.UserID, &o.Shard, &o.Quantity, &o.Epoch, &o.ExpiresAt, &o.CreatedAt); err != nil {
			return err
		}
		if o.Shard < 0 || o.Shard >= shards {
			return fmt.Errorf("order %s in shard %d, campaign has %d shards", o.ReservationID, o.Shard, shards)
		}
		sums[o.Shard].Pending += int64(o.Quantity)
		if buf = append(buf, o); len(buf) == batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return flush()
}

func streamHolders(ctx context.Context, tx pgx.Tx, campaignID string, batch int, fn func(context.Context, []Holder) error) error {
	rows, err := tx.Query(ctx, sqlHolders, campaignID)
	if err != nil {
		return err
	}
	defer rows.Close()
	buf := make([]Holder, 0, batch)
	for rows.Next() {
		var h Holder
		if err := rows.Scan(&h.UserID, &h.Units); err != nil {
			return err
		}
		if buf = append(buf, h); len(buf) == batch {
			if fn != nil {
				if err := fn(ctx, buf); err != nil {
					return err
				}
			}
			buf = buf[:0]
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(buf) > 0 && fn != nil {
		return fn(ctx, buf)
	}
	return nil
}
