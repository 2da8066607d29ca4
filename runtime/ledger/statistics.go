package ledger

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// sqlOrdersStatistics: whether the orders hold rows, and whether the planner
// has statistics of them (none: never analyzed, or analyzed while empty).
const sqlOrdersStatistics = `SELECT EXISTS (SELECT 1 FROM flashsale_orders), EXISTS (
    SELECT 1 FROM pg_stats s
    JOIN pg_namespace n ON n.nspname = s.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = s.tablename
    WHERE c.oid = 'flashsale_orders'::regclass AND s.attname = 'campaign_id')`

// Bounds of ensureStatistics's ANALYZE, and how long after a failed one it
// tries again. The table lock it waits for is held by autovacuum while it
// works on the orders, which analyzes them as well.
const (
	analyzeLockTimeout = time.Second
	analyzeTimeout     = time.Minute
	analyzeRetryAfter  = time.Minute
)

// ensureStatistics analyzes the orders when they hold rows and have no
// statistics, until it has once seen them with both. Without statistics,
// the planner takes a sale for a row or two and reaches a batch of its
// orders through a scan of the sale by the buyers' index instead of one
// probe of the primary key per order: the sweeper's cancel of each batch
// read the whole sale twice, 80–98 ms a batch at 20,000 orders against
// 8–10 ms (docs/sweeper.md). Autovacuum analyzes a new table within a
// minute of its first rows, unless it is off or behind; the sweeper, a
// rebuild and the writer's lookup of duplicates, which meet this first, do
// not wait for it.
//
// It only helps the plans, so it never fails its caller, and a caller that
// finds another at it goes on without waiting. A failure (the database
// away, the table locked, an ANALYZE skipped because the role does not own
// the table, which PostgreSQL only warns about) is tried again a minute
// later.
func (l *Ledger) ensureStatistics(ctx context.Context) {
	if !l.statsMu.TryLock() {
		return
	}
	defer l.statsMu.Unlock()
	if l.statsSeen || time.Now().Before(l.statsRetry) {
		return
	}
	rows, stats, err := l.ordersStatistics(ctx)
	if err == nil && rows && !stats {
		if err = l.analyzeOrders(ctx); err == nil {
			rows, stats, err = l.ordersStatistics(ctx)
		}
	}
	switch {
	case err != nil || rows && !stats:
		l.statsRetry = time.Now().Add(analyzeRetryAfter)
	default:
		l.statsSeen = rows // an empty table is asked again next time
	}
}

func (l *Ledger) ordersStatistics(ctx context.Context) (rows, stats bool, err error) {
	err = l.pool.QueryRow(ctx, sqlOrdersStatistics).Scan(&rows, &stats)
	return rows, stats, err
}

func (l *Ledger) analyzeOrders(ctx context.Context) error {
	return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)`,
			strconv.FormatInt(analyzeLockTimeout.Milliseconds(), 10), strconv.FormatInt(analyzeTimeout.Milliseconds(), 10))
		if err == nil {
			_, err = tx.Exec(ctx, `ANALYZE flashsale_orders`)
		}
		return err
	})
}
