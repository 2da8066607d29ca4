package ledger

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlTestTrueCounts counts units per shard the slow way, from the orders.
const sqlTestTrueCounts = `SELECT shard,
    coalesce(sum(quantity) FILTER (WHERE status = 'PENDING'), 0)::bigint,
    coalesce(sum(quantity) FILTER (WHERE status = 'COMMITTED'), 0)::bigint
FROM flashsale_orders WHERE campaign_id = $1 GROUP BY shard`

// trueCounts is what the counters must say, counted from the orders.
func trueCounts(t testing.TB, l *Ledger, c Campaign) []ShardCounts {
	t.Helper()
	out := make([]ShardCounts, c.Shards)
	rows, err := l.Pool().Query(testCtx(t), sqlTestTrueCounts, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	var shard int
	var pending, committed int64
	if _, err := pgx.ForEachRow(rows, []any{&shard, &pending, &committed}, func() error {
		out[shard] = ShardCounts{Committed: committed, Pending: pending}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustCountsAgree(t testing.TB, l *Ledger, c Campaign) []ShardCounts {
	t.Helper()
	got, err := l.CountsByShard(testCtx(t), c.ID, c.Shards)
	if err != nil {
		t.Fatal(err)
	}
	if want := trueCounts(t, l, c); !slices.Equal(got, want) {
		t.Fatalf("counters %v, the orders say %v", got, want)
	}
	return got
}

func TestCountsByShard(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 3)
	other := newCampaign(t, l, 100, 3)
	add := func(camp Campaign, shard, qty int, st Status, expiresIn time.Duration) {
		o := pendingOrder(camp, "u", shard, 0)
		o.Quantity, o.Status = qty, st
		if st == StatusCommitted {
			o.PaymentToken = "pay"
		}
		insertOrder(t, l, o, expiresIn)
	}
	add(c, 0, 2, StatusCommitted, time.Hour)
	add(c, 0, 1, StatusCommitted, time.Hour)
	add(c, 0, 1, StatusPending, time.Hour)
	add(c, 0, 3, StatusPending, -time.Hour) // expired, not yet swept: Redis still holds it
	add(c, 2, 1, StatusPending, time.Hour)
	add(c, 2, 5, StatusCancelledBySweeper, time.Hour)
	add(c, 2, 5, StatusCancelledByUser, time.Hour)
	add(c, 2, 5, StatusAbandoned, time.Hour)
	add(other, 1, 7, StatusCommitted, time.Hour)

	got, err := l.CountsByShard(ctx, c.ID, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []ShardCounts{{Committed: 3, Pending: 4}, {}, {Pending: 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	if _, err := l.CountsByShard(ctx, c.ID, 2); err == nil {
		t.Error("an order in shard 2 of a 2-shard count went unnoticed")
	}
	if _, err := l.CountsByShard(ctx, c.ID, 0); err == nil {
		t.Error("a count of 0 shards was answered")
	}
	mustCountsAgree(t, l, other)
}

// The counters follow every statement that changes an order's status, from
// every path that writes one, under concurrency: the group-commit writer,
// checkouts, a buyer's cancel, the sweeper's cancel, abandonment, a
// rebuild's cancel of the expired, and hand-written SQL.
func TestCountsFollowEveryStatusChange(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 10_000, 4)
	m := l.NewMaterializer(MaterializerConfig{MaxBatch: 16})
	defer m.Close()

	const n = 400
	orders := make([]Order, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range orders {
		o := pendingOrder(c, fmt.Sprintf("u%d", i%50), i%c.Shards, time.Hour)
		o.Quantity = 1 + i%3
		if i%5 == 0 {
			o.ExpiresAt = time.Now().Add(-time.Hour) // for the sweeper
		}
		orders[i] = o
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- m.Submit(ctx, o)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	mustCountsAgree(t, l, c)

	// Checkouts, cancels and sweeps at once, several on the same rows.
	rng := rand.New(rand.NewPCG(1, 2))
	for i, o := range orders {
		wg.Add(1)
		op := rng.IntN(4)
		go func() {
			defer wg.Done()
			var err error
			switch op {
			case 0:
				_, _, err = l.Checkout(ctx, c.ID, o.ReservationID, o.UserID, fmt.Sprintf("pay-%d", i))
			case 1:
				_, _, err = l.CancelByUser(ctx, c.ID, o.ReservationID, o.UserID)
			case 2:
				_, err = l.CancelExpired(ctx, c.ID, []string{o.ReservationID}, 0)
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	mustCountsAgree(t, l, c)

	lost := pendingOrder(c, "gone", 1, time.Hour)
	lost.Status = StatusAbandoned
	if _, _, err := l.RecordAbandoned(ctx, []Order{lost}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.BeginRebuild(ctx, c.ID, 0); err != nil {
		t.Fatal(err)
	}
	// An operator's hand-written SQL is counted too.
	for _, stmt := range []string{
		`UPDATE flashsale_orders SET status = 'CANCELLED_BY_USER' WHERE campaign_id = $1 AND status = 'PENDING' AND shard = 3`,
		`DELETE FROM flashsale_orders WHERE campaign_id = $1 AND shard = 2`,
		`UPDATE flashsale_orders SET updated_at = now() WHERE campaign_id = $1`,
	} {
		if _, err := l.Pool().Exec(ctx, stmt, c.ID); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	got := mustCountsAgree(t, l, c)
	if got[0].Committed == 0 || got[2] != (ShardCounts{}) {
		t.Errorf("counts %v: the test changed less than it meant to", got)
	}
}

// A status refresh must not read order rows: its cost is O(shards) whatever
// the sale's size. The role below may read everything but the orders.
func TestCountsReadNoOrderRow(t *testing.T) {
	t.Parallel()
	dsn := newDSN(t, testPG)
	l := openLedger(t, dsn)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	o := insertOrder(t, l, pendingOrder(c, "u", 1, time.Hour), time.Hour)

	role := "counter_" + strings.ReplaceAll(uniqueID("r"), "-", "_")
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA public TO ` + role,
		`GRANT SELECT ON ALL TABLES IN SCHEMA public TO ` + role,
		`REVOKE SELECT ON flashsale_orders FROM ` + role,
	} {
		if _, err := l.Pool().Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	blind, err := Open(ctx, strings.Replace(dsn, "://postgres@", "://"+role+"@", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer blind.Close()
	var pgErr *pgconn.PgError
	if _, err := blind.GetOrder(ctx, o.CampaignID, o.ReservationID); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("the role can read orders (%v): the test proves nothing", err)
	}
	got, err := blind.CountsByShard(ctx, c.ID, c.Shards)
	if err != nil {
		t.Fatalf("counts read order rows: %v", err)
	}
	if want := []ShardCounts{{}, {Pending: 1}}; !slices.Equal(got, want) {
		t.Errorf("counts %v, want %v", got, want)
	}
}

// Upgrading a ledger that already holds orders fills the counters from them.
func TestMigrationCountsExistingOrders(t *testing.T) {
	t.Parallel()
	dsn := newDSN(t, testPG)
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	migs, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	// The ledger as the previous release left it: the first migration only.
	for _, stmt := range []string{sqlCreateMigrationsTable, migs[0].sql} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, sqlRecordMigration, migs[0].version, migs[0].name, migs[0].checksum); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`INSERT INTO flashsale_campaigns (campaign_id, namespace, name, sku, allocation, shards) VALUES ('old', 'shop', 'drop', 'sku', 100, 2)`,
		`INSERT INTO flashsale_shards VALUES ('old', 0, 50), ('old', 1, 50)`,
		`INSERT INTO flashsale_orders (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at, payment_token) VALUES
            ('a', 'old', 'sku', 'u', 0, 2, 'COMMITTED', 1, now(), 'pay'),
            ('b', 'old', 'sku', 'u', 1, 1, 'PENDING', 1, now(), NULL),
            ('c', 'old', 'sku', 'v', 1, 3, 'PENDING', 1, now(), NULL),
            ('d', 'old', 'sku', 'v', 1, 4, 'CANCELLED_BY_USER', 1, now(), NULL)`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	l := openLedger(t, dsn) // migrates
	got := mustCountsAgree(t, l, Campaign{ID: "old", Shards: 2})
	if want := []ShardCounts{{Committed: 2}, {Pending: 4}}; !slices.Equal(got, want) {
		t.Errorf("counts after the upgrade %v, want %v", got, want)
	}
}
