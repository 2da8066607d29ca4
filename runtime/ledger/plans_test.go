package ledger

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// sqlTestBulkOrders writes $2 orders of campaign $1 in status $3, expired an
// hour ago, spread over four shards.
const sqlTestBulkOrders = `INSERT INTO flashsale_orders
    (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at, payment_token, request_key)
SELECT (g % 4) || '.' || md5($1 || g), $1, 'sku', 'u' || g, g % 4, 1, $3, 1, now() - interval '1 hour',
       CASE WHEN $3 = 'COMMITTED' THEN 'pay' || g END, md5($1 || g)
FROM generate_series(1, $2::integer) g`

// A sale's orders are reached through the index of the key each statement
// looks them up by, whatever the statistics say about the sale. With the
// sale's id in sight of the planner, a sale too new for the statistics (one
// row, by them) got a scan of the whole sale for every checkout, request
// lookup and sweeper batch, and the cancels of expired reservations a loop
// comparing every row of the sale with every cancelled one: a rebuild of
// 10,000 expired reservations took 19 s. A sale in the statistics got its
// cancels planned as a scan of every sale's orders. A buyer's list of what
// it holds goes through the holders' index.
func TestSaleLookupsUseTheirKeyWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	if _, err := l.pool.Exec(ctx, `ALTER TABLE flashsale_orders SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	bulk := func(c Campaign, n int, status Status) {
		t.Helper()
		if _, err := l.pool.Exec(ctx, sqlTestBulkOrders, c.ID, n, string(status)); err != nil {
			t.Fatal(err)
		}
	}
	// Finished sales, and a live one whose expired reservations are a large
	// part of the table: all in the statistics.
	for range 4 {
		bulk(newCampaign(t, l, 20_000, 4), 20_000, StatusCommitted)
	}
	seen := newCampaign(t, l, 40_000, 4)
	bulk(seen, 40_000, StatusPending)
	if _, err := l.pool.Exec(ctx, `ANALYZE flashsale_orders`); err != nil {
		t.Fatal(err)
	}
	// A sale the statistics have never seen.
	unseen := newCampaign(t, l, 5_000, 4)
	bulk(unseen, 5_000, StatusPending)

	batch := func(c Campaign) []string {
		rows, err := l.pool.Query(ctx, `SELECT reservation_id FROM flashsale_orders WHERE campaign_id = $1 ORDER BY reservation_id LIMIT 256`, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	// How many index conditions a statement that looks the orders up more
	// than once must have by its key: the sweeper's cancel, the lock's, the
	// update's, and the statuses' of the ids it did not cancel.
	lookups := map[string]int{"the sweeper's cancel": 3}
	for _, c := range []struct {
		name string
		sale Campaign
	}{{"a sale in the statistics", seen}, {"a sale not in them", unseen}} {
		ids := batch(c.sale)
		for _, q := range []struct {
			name string
			sql  string
			args []any
			key  string // what an index condition on the orders must name
		}{
			{"checkout", sqlCheckout, []any{ids[0], c.sale.ID, "u", "pay"}, byKeyOrBuyer},
			{"the expired checkout's write", sqlExpiredCheckout, []any{ids[0], c.sale.ID, "u"}, byKeyOrBuyer},
			{"GetOrder", sqlGetOrder, []any{c.sale.ID, ids[0]}, "request_key = ANY"},
			{"cancel by the buyer", sqlCancelByUser, []any{ids[0], c.sale.ID, "u"}, byKeyOrBuyer},
			{"a request's order", sqlGetRequestOrder, []any{c.sale.ID, "k"}, "request_key = "},
			{"the writer's duplicates", sqlExistingOrders, []any{ids, c.sale.ID}, "request_key = ANY"},
			{"the sweeper's cancel", sqlCancelExpired, []any{c.sale.ID, ids, int64(0)}, "request_key = ANY"},
			{"the rebuild's cancel", sqlCancelExpiredAll, []any{c.sale.ID, int64(0)}, "request_key = ANY"},
			{"statuses of abandoned rows", sqlStatusesAnyCampaign, []any{[]string{c.sale.ID}, ids[:1]}, "request_key = ANY"},
			{"a buyer's held orders", sqlHeldBy, []any{c.sale.ID, "u7"}, "user_id = "},
		} {
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				plan := explainPrepared(t, l, mode, q.sql, q.args...)
				if strings.Contains(plan, "Seq Scan on flashsale_orders") || strings.Contains(plan, "Join Filter") ||
					strings.Contains(plan, "Hash Join") || indexCondsNaming(plan, q.key) < cmp.Or(lookups[q.name], 1) {
					t.Errorf("%s, %s (%s): the orders are not reached by their key (%s):\n%s", q.name, c.name, mode, q.key, clip(plan))
				}
			}
		}
	}
	// And the cancels cancel what they should.
	snap, err := l.BeginRebuild(ctx, unseen.ID, 0)
	if err != nil || snap.Expired != 5_000 {
		t.Fatalf("the rebuild's cancel of the unseen sale: %d rows, %v; want 5000", snap.Expired, err)
	}
}

// explainPrepared is the plan of sql with args as a prepared statement
// (pgx prepares each statement it runs) in plan cache mode mode, inside a
// transaction that is rolled back.
func explainPrepared(t *testing.T, l *Ledger, mode, sql string, args ...any) string {
	t.Helper()
	ctx := testCtx(t)
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "PREPARE lookup AS "+sql); err != nil {
		t.Fatal(err)
	}
	// A prepared statement outlives the transaction.
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE lookup") }()
	params := make([]string, len(args))
	for i := range args {
		params[i] = "$" + strconv.Itoa(i+1)
	}
	// The simple protocol writes the arguments into the text as literals.
	return explain(t, ctx, tx, "EXPLAIN EXECUTE lookup("+strings.Join(params, ", ")+")",
		append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
}

// byKeyOrBuyer: a statement that names the order's id and its buyer may reach
// it through the primary key (two keys a row may have, so two rows by the
// planner's count) or through the buyer's index (one row by its count, at
// most maxPerUser in fact): either reads a few rows of the sale.
const byKeyOrBuyer = "request_key = ANY|user_id = "

// indexCondsNaming counts the index conditions of plan that name key, or
// one of the keys it lists separated by "|".
func indexCondsNaming(plan, key string) int {
	n := 0
	for _, line := range strings.Split(plan, "\n") {
		cond, ok := strings.CutPrefix(strings.TrimSpace(line), "Index Cond: ")
		if ok && slices.ContainsFunc(strings.Split(key, "|"), func(k string) bool { return strings.Contains(cond, k) }) {
			n++
		}
	}
	return n
}

// clip cuts each line of a plan to 160 bytes (a batch's ids are one line).
func clip(plan string) string {
	lines := strings.Split(plan, "\n")
	for i, l := range lines {
		if len(l) > 160 {
			lines[i] = l[:160] + "..."
		}
	}
	return strings.Join(lines, "\n")
}
