package ledger

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrateUpTo applies the migrations before version `until` that are not
// applied yet, as Migrate would.
func migrateUpTo(t *testing.T, pool *pgxpool.Pool, until int) {
	t.Helper()
	ctx := testCtx(t)
	migs, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, sqlCreateMigrationsTable); err != nil {
		t.Fatal(err)
	}
	var applied int
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM flashsale_schema_migrations`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		if m.version >= until {
			break
		}
		if m.version <= applied {
			continue
		}
		if _, err := pool.Exec(ctx, m.sql); err != nil {
			t.Fatalf("migration %04d: %v", m.version, err)
		}
		if _, err := pool.Exec(ctx, sqlRecordMigration, m.version, m.name, m.checksum); err != nil {
			t.Fatal(err)
		}
	}
}

func primaryKeyColumns(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var cols string
	err := pool.QueryRow(testCtx(t), `SELECT string_agg(a.attname, ',' ORDER BY k.n)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = 'flashsale_orders'::regclass AND i.indisprimary`).Scan(&cols)
	if err != nil {
		t.Fatal(err)
	}
	return cols
}

// A ledger written before 0006 keeps its orders, and its primary key then
// leads with the campaign: a new sale writes only into its own part of it.
func TestMigrationKeysOrdersByCampaign(t *testing.T) {
	ctx := testCtx(t)
	pool, err := pgxpool.New(ctx, newDSN(t, testPG))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	migrateUpTo(t, pool, 6)
	if cols := primaryKeyColumns(t, pool); cols != "reservation_id" {
		t.Fatalf("before 0006 the primary key is %q", cols)
	}
	for i, c := range []string{"old-sale", "new-sale"} {
		if _, err := pool.Exec(ctx, `INSERT INTO flashsale_orders
    (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at, request_key)
VALUES ($1, $2, 'sku', 'u', 0, 1, 'PENDING', 1, now() + interval '1 hour', $3)`,
			fmt.Sprintf("0.key%d", i), c, fmt.Sprintf("key%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	migrateUpTo(t, pool, 7)
	if cols := primaryKeyColumns(t, pool); cols != "campaign_id,reservation_id" {
		t.Fatalf("after 0006 the primary key is %q, want campaign_id,reservation_id", cols)
	}
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	l := &Ledger{pool: pool}
	for i, c := range []string{"old-sale", "new-sale"} {
		if o, err := l.GetOrder(ctx, c, fmt.Sprintf("0.key%d", i)); err != nil || o.Status != StatusPending {
			t.Fatalf("order of %s after the migration: %+v %v", c, o, err)
		}
	}
	if _, err := l.GetOrder(ctx, "old-sale", "0.key1"); err == nil {
		t.Fatal("an order found under another campaign")
	}
}

// After 0007 the orders have one unique index, the primary key (campaign,
// request key). The rows of a request written twice before 0003 (on two
// shards: the second has no request key) and a row whose id has no dot are
// each still found by their reservation id, taken by checkout and cancel, and
// a new row of either request is refused.
func TestMigrationKeysOrdersByRequest(t *testing.T) {
	ctx := testCtx(t)
	pool, err := pgxpool.New(ctx, newDSN(t, testPG))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	migrateUpTo(t, pool, 3)
	for _, id := range []string{"0.k", "1.k", "legacy"} {
		if _, err := pool.Exec(ctx, `INSERT INTO flashsale_orders
    (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at, created_at)
VALUES ($1, 'c', 'sku', 'u', 0, 1, 'PENDING', 1, now() + interval '1 hour', now() + make_interval(secs => length($1)))`, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if cols := primaryKeyColumns(t, pool); cols != "campaign_id,request_key" {
		t.Fatalf("after 0007 the primary key is %q, want campaign_id,request_key", cols)
	}
	var indexes int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE indrelid = 'flashsale_orders'::regclass AND indisunique`).Scan(&indexes); err != nil || indexes != 1 {
		t.Fatalf("%d unique indexes on the orders (%v), want the primary key alone", indexes, err)
	}
	l := &Ledger{pool: pool}
	for id, key := range map[string]string{"0.k": "k", "1.k": ".1.k", "legacy": ".legacy"} {
		o, err := l.GetOrder(ctx, "c", id)
		if err != nil || o.ReservationID != id {
			t.Fatalf("order %s after the migration: %+v %v", id, o, err)
		}
		var got string
		if err := pool.QueryRow(ctx, `SELECT request_key FROM flashsale_orders WHERE reservation_id = $1`, id).Scan(&got); err != nil || got != key {
			t.Fatalf("order %s has request key %q (%v), want %q", id, got, err, key)
		}
	}
	if out, o, err := l.Checkout(ctx, "c", "1.k", "u", "pay"); err != nil || out != CheckoutCommitted || o.ReservationID != "1.k" {
		t.Fatalf("checkout of the duplicate: %v %+v %v", out, o, err)
	}
	if out, _, err := l.CancelByUser(ctx, "c", "legacy", "u"); err != nil || out != CancelCancelled {
		t.Fatalf("cancel of the undotted id: %v %v", out, err)
	}
	got, err := l.CancelExpired(ctx, "c", []string{"0.k", "1.k", "legacy"}, 0)
	if err != nil || got["0.k"] != StatusPending || got["1.k"] != StatusCommitted || got["legacy"] != StatusCancelledByUser {
		t.Fatalf("statuses after the migration: %v %v", got, err)
	}
	// A request's new row, on another shard, is its duplicate.
	if _, err := pool.Exec(ctx, `INSERT INTO flashsale_orders
    (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at, request_key)
VALUES ('2.k', 'c', 'sku', 'u', 2, 1, 'PENDING', 1, now(), 'k')`); err == nil {
		t.Fatal("a second row of request k was written")
	}
}

// Every statement that finds orders by id names the campaign, so an index led
// by the campaign serves it from the sale's own part (the primary key, or the
// buyer's index); a lookup by id alone would have no index at all.
func TestOrderLookupsByIDUseThePrimaryKey(t *testing.T) {
	l := newLedger(t)
	ctx := testCtx(t)
	ids, campaigns := []string{"0.a"}, []string{"c"}
	lookups := []struct {
		name string
		sql  string
		args []any
	}{
		{"GetOrder", sqlGetOrder, []any{"c", "0.a"}},
		{"the expired checkout's write", sqlExpiredCheckout, []any{"0.a", "c", "u"}},
		{"checkout", sqlCheckout, []any{"0.a", "c", "u", "pay"}},
		{"cancel by the buyer", sqlCancelByUser, []any{"0.a", "c", "u"}},
		{"the sweeper's cancel", sqlCancelExpired, []any{"c", ids, int64(0)}},
		{"the rebuild's cancel", sqlCancelExpiredAll, []any{"c", int64(0)}},
		{"statuses of abandoned rows", sqlStatusesAnyCampaign, []any{campaigns, ids}},
		{"the writer's duplicates", sqlExistingOrders, []any{ids, "c"}},
	}
	for _, q := range lookups {
		t.Run(q.name, func(t *testing.T) {
			plan := explainWithoutSeqScans(t, ctx, l, q.sql, q.args...)
			conds := 0
			orders := false // the index scan above is of the orders (not of the late payments)
			for _, line := range strings.Split(plan, "\n") {
				if strings.Contains(line, "Scan using ") {
					orders = strings.Contains(line, " on flashsale_orders")
				}
				if cond, ok := strings.CutPrefix(strings.TrimSpace(line), "Index Cond: "); ok && orders {
					conds++
					if !strings.HasPrefix(strings.TrimLeft(cond, "("), "campaign_id = ") {
						t.Fatalf("an index lookup not led by the campaign:\n%s", plan)
					}
				}
			}
			if conds == 0 || strings.Contains(plan, "Seq Scan on flashsale_orders") || strings.Contains(plan, "Seq Scan on flashsale_late_payments") {
				t.Fatalf("no index serves it:\n%s", plan)
			}
		})
	}
}

// explainWithoutSeqScans is the plan PostgreSQL picks when it must use an
// index wherever one serves: on a test's tiny table it would scan instead.
// Writes are explained inside a transaction that is rolled back.
func explainWithoutSeqScans(t *testing.T, ctx context.Context, l *Ledger, sql string, args ...any) string {
	t.Helper()
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, set := range []string{"SET LOCAL enable_seqscan = off", "SET LOCAL enable_bitmapscan = off"} {
		if _, err := tx.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	return explain(t, ctx, tx, "EXPLAIN "+sql, args...)
}

// explain runs an EXPLAIN statement in tx and returns the plan's lines.
func explain(t *testing.T, ctx context.Context, tx pgx.Tx, sql string, args ...any) string {
	t.Helper()
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
