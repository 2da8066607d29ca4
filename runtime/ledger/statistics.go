package ledger

import "context"

// sqlOrdersStatistics: whether the orders hold rows, and whether the planner
// has statistics of them (none: never analyzed, or analyzed while empty).
const sqlOrdersStatistics = `SELECT EXISTS (SELECT 1 FROM flashsale_orders), EXISTS (
    SELECT 1 FROM pg_stats s
    JOIN pg_namespace n ON n.nspname = s.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = s.tablename
    WHERE c.oid = 'flashsale_orders'::regclass AND s.attname = 'campaign_id')`

// ensureStatistics analyzes the orders, once per process, when they hold rows
// and have no statistics. Without any, the planner takes a sale for a row
// or two and reaches a batch of its orders through a scan of the sale by
// the buyers' index instead of one probe of the primary key per order: the
// sweeper's cancel of each batch read the whole sale twice, 80–98 ms a
// batch at 20,000 orders against 8–10 ms (docs/tuning.md). Autovacuum
// analyzes a new table within a minute of its first rows, unless it is off
// or behind; the sweeper, a rebuild and the writer's lookup of duplicates,
// which meet this first, do not wait for it. It only helps the plans: an error (the database away, an ANALYZE
// refused to a role that does not own the table) leaves them as they were,
// and the statement that called it goes on.
func (l *Ledger) ensureStatistics(ctx context.Context) {
	l.statsMu.Lock()
	defer l.statsMu.Unlock()
	if l.statsSeen {
		return
	}
	var rows, stats bool
	if err := l.pool.QueryRow(ctx, sqlOrdersStatistics).Scan(&rows, &stats); err != nil {
		return
	}
	if rows && !stats {
		if _, err := l.pool.Exec(ctx, `ANALYZE flashsale_orders`); err != nil {
			return
		}
	}
	l.statsSeen = rows // an empty table is asked again next time
}
