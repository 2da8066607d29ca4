package ledger

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/jackc/pgx/v5"
)

// testPG is the package's one PostgreSQL server; every test gets its own database.
var testPG *testharness.Postgres

func TestMain(m *testing.M) {
	testharness.Main(m, func() (err error) {
		testPG, err = testharness.StartPostgres()
		return err
	})
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newDSN(t testing.TB, pg *testharness.Postgres) string {
	t.Helper()
	dsn, err := pg.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// newLedger opens a ledger on a fresh database of the package server.
func newLedger(t testing.TB) *Ledger {
	t.Helper()
	return openLedger(t, newDSN(t, testPG))
}

func openLedger(t testing.TB, dsn string) *Ledger {
	t.Helper()
	l, err := Open(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

var idSeq atomic.Int64

// uniqueID returns an id unique within the test binary.
func uniqueID(prefix string) string {
	return prefix + "-" + strconv.FormatInt(idSeq.Add(1), 10)
}

func newCampaign(t testing.TB, l *Ledger, allocation int64, shards int) Campaign {
	t.Helper()
	c, created, err := l.EnsureCampaign(testCtx(t), Campaign{
		ID: uniqueID("camp"), Namespace: "shop", Name: "drop", SKU: "itm-ps5-pro",
		Allocation: allocation, Shards: shards,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Fatalf("campaign %s: not created", c.ID)
	}
	return c
}

// pendingOrder is a PENDING order of c valid for ttl by the local clock.
func pendingOrder(c Campaign, user string, shard int, ttl time.Duration) Order {
	return Order{
		ReservationID: uniqueID("res"), CampaignID: c.ID, SKU: c.SKU, UserID: user,
		Shard: shard, Quantity: 1, Status: StatusPending, Epoch: c.Epoch,
		ExpiresAt: time.Now().Add(ttl),
	}
}

// Test-only SQL: rows in any state, with expires_at relative to the
// database clock so expiry edges do not depend on clock skew.
const (
	sqlTestInsertOrder = `INSERT INTO flashsale_orders
    (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at, payment_token, request_key)
SELECT t.r, $2, $3, $4, $5, $6, $7, $8, now() + $9::bigint * interval '1 microsecond', $10, ` + requestKeyOfR + `
FROM (VALUES ($1::text)) AS t(r)`
	sqlTestCountOrders   = `SELECT count(*) FROM flashsale_orders WHERE campaign_id = $1`
	sqlTestOrderExists   = `SELECT EXISTS (SELECT 1 FROM flashsale_orders WHERE reservation_id = $1)`
	sqlTestLatePayments  = `SELECT order_status FROM flashsale_late_payments WHERE reservation_id = $1 ORDER BY id`
	sqlTestCountVersions = `SELECT count(*) FROM flashsale_schema_migrations`
	sqlTestTableExists   = `SELECT to_regclass($1) IS NOT NULL`
	sqlTestEditChecksum  = `UPDATE flashsale_schema_migrations SET checksum = 'edited' WHERE version = 1`
	sqlTestNoSeqScan     = `SET enable_seqscan = off`
	sqlTestExplain       = `EXPLAIN `
)

// Row locks the tests hold, as a rebuild (the campaign row) or a checkout or
// cancel (an order row) would.
const (
	sqlTestLockCampaign = `SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE`
	sqlTestLockOrder    = `SELECT 1 FROM flashsale_orders WHERE reservation_id = $1 FOR UPDATE`
)

// holdLock opens a transaction that takes a row lock (lockSQL with id) and
// keeps it until the caller commits or rolls back, or the test ends.
func holdLock(t testing.TB, l *Ledger, lockSQL, id string) pgx.Tx {
	t.Helper()
	ctx := testCtx(t)
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, lockSQL, id); err != nil {
		t.Fatal(err)
	}
	return tx
}

// insertOrder writes o directly with expires_at = DB now() + expiresIn.
func insertOrder(t testing.TB, l *Ledger, o Order, expiresIn time.Duration) Order {
	t.Helper()
	var token *string
	if o.PaymentToken != "" {
		token = &o.PaymentToken
	}
	if _, err := l.Pool().Exec(testCtx(t), sqlTestInsertOrder, o.ReservationID, o.CampaignID, o.SKU, o.UserID,
		o.Shard, o.Quantity, string(o.Status), o.Epoch, expiresIn.Microseconds(), token); err != nil {
		t.Fatal(err)
	}
	stored, err := l.GetOrder(testCtx(t), o.CampaignID, o.ReservationID)
	if err != nil {
		t.Fatal(err)
	}
	return stored
}

func orderExists(t testing.TB, l *Ledger, id string) bool {
	t.Helper()
	var ok bool
	if err := l.Pool().QueryRow(testCtx(t), sqlTestOrderExists, id).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func mustStatus(t testing.TB, l *Ledger, id string, want Status) {
	t.Helper()
	var campaign string
	if err := l.Pool().QueryRow(testCtx(t), `SELECT campaign_id FROM flashsale_orders WHERE reservation_id = $1`, id).Scan(&campaign); err != nil {
		t.Fatalf("order %s: %v", id, err)
	}
	o, err := l.GetOrder(testCtx(t), campaign, id)
	if err != nil {
		t.Fatal(err)
	}
	if o.Status != want {
		t.Fatalf("order %s: status %s, want %s", id, o.Status, want)
	}
}
