package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
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
	// Readers is the most connections that read at once (default 1, at most
	// the pool's size less one). Each shard's pending orders, and the
	// buyers, are read by one of them, all from one snapshot: on a Redis
	// Cluster the shards' masters are then written to at once, instead of
	// one after the other as the orders come in shard order. With more than
	// one reader, Pending and Holders are called from several goroutines at
	// once.
	Readers int
	// Pending gets every PENDING order of the campaign, one shard's at a
	// time per call, with what a rebuild restores: the reservation id, user,
	// shard, quantity, epoch, expiry and creation time (its campaign and
	// status are known; its SKU, payment token and update time are left
	// empty).
	Pending func(ctx context.Context, orders []Order) error
	// Holders gets every buyer holding units, in no particular order.
	Holders func(ctx context.Context, holders []Holder) error
}

const defaultRebuildBatch = 1000

const (
	// Only the columns a rebuild restores: every column scanned costs the
	// rebuild's CPU once per pending order.
	sqlPendingOrders = `SELECT reservation_id, user_id, quantity, epoch, expires_at, created_at FROM flashsale_orders
WHERE campaign_id = $1 AND status = 'PENDING' AND shard = $2`

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
// counters). Everything comes from one REPEATABLE READ snapshot, shared by
// every reader (pg_export_snapshot), so a checkout or a cancel running
// meanwhile is seen either entirely or not at all: the counts and the orders
// agree. Memory stays at one batch per reader whatever the number of orders.
func (l *Ledger) ReadRebuild(ctx context.Context, campaignID string, shards int, r RebuildReader) ([]ShardCounts, error) {
	if shards < 1 {
		return nil, fmt.Errorf("ledger: read rebuild %s: shards %d < 1", campaignID, shards)
	}
	if r.Batch <= 0 {
		r.Batch = defaultRebuildBatch
	}
	var out []ShardCounts
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlUntimedTx); err != nil {
			return err
		}
		counted, err := countsByShard(ctx, tx, campaignID, shards)
		if err != nil {
			return err
		}
		out = make([]ShardCounts, shards)
		for i := range out {
			out[i].Committed = counted[i].Committed
		}
		// The buyers first: theirs is the longest read, and it writes to
		// every shard.
		tasks := make(chan readTask, shards+1)
		tasks <- func(ctx context.Context, q querier) error {
			return streamHolders(ctx, q, campaignID, r.Batch, r.Holders)
		}
		for i := range shards {
			tasks <- func(ctx context.Context, q querier) error {
				return streamPending(ctx, q, campaignID, i, r.Batch, &out[i].Pending, r.Pending)
			}
		}
		close(tasks)
		if err := l.readShared(ctx, tx, r.Readers, tasks); err != nil {
			return err
		}
		for i := range out {
			if out[i].Pending != counted[i].Pending {
				return fmt.Errorf("%w: shard %d counts %d pending units, its orders hold %d", ErrCountsDrift, i, counted[i].Pending, out[i].Pending)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: read rebuild %s: %w", campaignID, err)
	}
	return out, nil
}

// readTask is one stream of ReadRebuild, read with q.
type readTask func(ctx context.Context, q querier) error

// readShared runs tasks on tx and on up to readers−1 more connections that
// import tx's snapshot, each task once; the first error stops them all. A
// reader still waiting for a connection when tx has run out of tasks gives up
// waiting: tx alone always finishes the read, so a pool that others hold
// cannot stall it.
func (l *Ledger) readShared(ctx context.Context, tx pgx.Tx, readers int, tasks <-chan readTask) error {
	readers = min(readers, int(l.pool.Config().MaxConns)-1, cap(tasks))
	if readers <= 1 {
		return runTasks(ctx, tx, tasks)
	}
	var snapshot string
	if err := tx.QueryRow(ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	acquire, drained := context.WithCancel(gctx)
	defer drained()
	g.Go(func() error {
		defer drained()
		return runTasks(gctx, tx, tasks)
	})
	for range readers - 1 {
		g.Go(func() error {
			conn, err := l.pool.Acquire(acquire)
			if err != nil {
				if acquire.Err() != nil && gctx.Err() == nil {
					return nil // drained: nothing left to read
				}
				return err
			}
			defer conn.Release()
			return pgx.BeginTxFunc(gctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(rtx pgx.Tx) error {
				if _, err := rtx.Exec(gctx, `SET TRANSACTION SNAPSHOT '`+snapshot+`'`); err != nil {
					return fmt.Errorf("importing the rebuild's snapshot: %w", err)
				}
				if _, err := rtx.Exec(gctx, sqlUntimedTx); err != nil {
					return err
				}
				return runTasks(gctx, rtx, tasks)
			})
		})
	}
	return g.Wait()
}

// runTasks runs tasks with q until none is left or ctx ends. Ended, it
// returns ctx's error, never nil: a read cut short must not pass for a read
// whose shards came up short (when another reader failed first, the group
// returns that reader's error instead).
func runTasks(ctx context.Context, q querier, tasks <-chan readTask) error {
	for task := range tasks {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := task(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// streamPending streams shard's pending orders to fn and adds their units
// to *units.
func streamPending(ctx context.Context, q querier, campaignID string, shard, batch int, units *int64, fn func(context.Context, []Order) error) error {
	rows, err := q.Query(ctx, sqlPendingOrders, campaignID, shard)
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
		// Scanned in place: a local Order whose fields Scan points at would
		// be allocated once per row.
		buf = append(buf, Order{CampaignID: campaignID, Status: StatusPending, Shard: shard})
		o := &buf[len(buf)-1]
		if err := rows.Scan(&o.ReservationID, &o.UserID, &o.Quantity, &o.Epoch, &o.ExpiresAt, &o.CreatedAt); err != nil {
			return err
		}
		*units += int64(o.Quantity)
		if len(buf) == batch {
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

func streamHolders(ctx context.Context, q querier, campaignID string, batch int, fn func(context.Context, []Holder) error) error {
	rows, err := q.Query(ctx, sqlHolders, campaignID)
	if err != nil {
		return err
	}
	defer rows.Close()
	buf := make([]Holder, 0, batch)
	for rows.Next() {
		buf = append(buf, Holder{})
		h := &buf[len(buf)-1]
		if err := rows.Scan(&h.UserID, &h.Units); err != nil {
			return err
		}
		if len(buf) == batch {
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
