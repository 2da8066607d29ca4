package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

func setReadOnly(t *testing.T, pg *testharness.Postgres, on bool) {
	t.Helper()
	if err := pg.SetReadOnly(on); err != nil {
		t.Fatal(err)
	}
}

// A server that answers reads but takes no writes (a primary demoted in a
// switchover keeps its sessions; a standby a multi-host DSN lands on) is not
// a healthy ledger: Ping, the writers' probe and Open say so; a writer's
// connection refused a write is closed, and no new one is opened on it.
// Writable again, everything works without a restart.
func TestALedgerThatTakesNoWrites(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t) // its own server: read-only for every session
	dsn := newDSN(t, pg)
	l := openLedger(t, dsn)
	ctx := testCtx(t)
	c := newCampaign(t, l, 1000, 2)
	m := l.NewMaterializer(MaterializerConfig{Timeout: 2 * time.Second})
	defer m.Close()
	if err := m.Submit(ctx, pendingOrder(c, "u", 0, time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := l.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.ProbeWrite(ctx, c.ID); err != nil {
		t.Fatal(err)
	}

	setReadOnly(t, pg, true)
	if err := l.Ping(ctx); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Ping of a read-only server: %v, want ErrReadOnly", err)
	}
	if err := m.ProbeWrite(ctx, c.ID); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("ProbeWrite on a read-only server: %v, want ErrReadOnly", err)
	}
	refused := pendingOrder(c, "u", 0, time.Hour)
	err := m.Submit(ctx, refused)
	if err == nil || errors.Is(err, ErrAmbiguous) || !ReadOnly(err) {
		t.Fatalf("Submit on a read-only server: %v, want the server's refusal", err)
	}
	// The connection that was refused is gone; a new one is not opened on a
	// server that takes no writes, so the row is not sent.
	err = m.Submit(ctx, pendingOrder(c, "u", 0, time.Hour))
	if err == nil || errors.Is(err, ErrAmbiguous) || !ReadOnly(err) {
		t.Fatalf("Submit after the refusal: %v, want a connection refused as read-only", err)
	}
	if open, err := Open(ctx, dsn); !errors.Is(err, ErrReadOnly) {
		if open != nil {
			open.Close()
		}
		t.Fatalf("Open of a read-only server: %v, want ErrReadOnly", err)
	}

	// The sessions open stay read-only, and new ones are writable (as those
	// a DSN naming every host opens on the new primary): Ping closes the
	// read-only ones, and so finds a writable one.
	db := dsn[strings.LastIndex(dsn, "/")+1:]
	db, _, _ = strings.Cut(db, "?")
	admin, err := pgx.Connect(ctx, pg.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{"SET default_transaction_read_only = off",
		"ALTER DATABASE " + pgx.Identifier{db}.Sanitize() + " SET default_transaction_read_only = off"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	testharness.Eventually(t, 10*time.Second, "Ping on a writable session", func() bool { return l.Ping(ctx) == nil })

	setReadOnly(t, pg, false)
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("Ping, writable again: %v", err)
	}
	if err := m.ProbeWrite(ctx, c.ID); err != nil {
		t.Fatalf("ProbeWrite, writable again: %v", err)
	}
	if err := m.Submit(ctx, pendingOrder(c, "u", 1, time.Hour)); err != nil {
		t.Fatalf("Submit, writable again: %v", err)
	}
	if orderExists(t, l, refused.ReservationID) {
		t.Fatal("a row refused by the read-only server exists")
	}
}

// The writers' probe fails while a lock a batch waits for is held (here the
// orders table's, as an index built without CONCURRENTLY holds it), and
// passes once it is released; it writes no row.
func TestProbeWriteWaitsForTheLocksABatchTakes(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 1000, 1)
	m := l.NewMaterializer(MaterializerConfig{Timeout: 2 * time.Second})
	defer m.Close()
	for _, lock := range []string{
		"LOCK TABLE flashsale_orders IN SHARE MODE",
		"SELECT 1 FROM flashsale_campaigns WHERE campaign_id = '" + c.ID + "' FOR UPDATE",
	} {
		tx, err := l.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, lock); err != nil {
			t.Fatal(err)
		}
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err = m.ProbeWrite(pctx, c.ID)
		cancel()
		if err == nil {
			t.Fatalf("ProbeWrite passed while %q is held", lock)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.ProbeWrite(ctx, c.ID); err != nil {
			t.Fatalf("ProbeWrite after %q: %v", lock, err)
		}
	}
	var n int
	if err := l.Pool().QueryRow(ctx, "SELECT count(*) FROM flashsale_orders").Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after the probes: %d %v", n, err)
	}
}

// A writer's connection opened while the orders table is locked prepares
// its statements before it serves a batch: the batch that waited for it was
// not sent (its units go back at once), not "outcome unknown" (held until
// they expire) as when the statement was prepared inside the batch's time.
func TestAWriterConnectionPreparesBeforeItsBatch(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 1000, 1)
	m := l.NewMaterializer(MaterializerConfig{Timeout: time.Second, Concurrency: 1})
	defer m.Close()
	tx, err := l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE flashsale_orders IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	o := pendingOrder(c, "u", 0, time.Hour)
	if err := m.Submit(ctx, o); err == nil || errors.Is(err, ErrAmbiguous) {
		t.Fatalf("Submit on a new connection while the table is locked: %v, want not sent", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Submit(ctx, pendingOrder(c, "u", 0, time.Hour)); err != nil {
		t.Fatalf("Submit once the lock is released: %v", err)
	}
	if orderExists(t, l, o.ReservationID) {
		t.Fatal("the row that was not sent exists")
	}
}

// A role or database that turns synchronous_commit off does not make the
// ledger's commits return before their WAL is flushed, the writers' nor the
// pool's (checkouts, cancels, sweeps): a 201 says the reservation is
// durable, and a checkout's answer that the order is paid. Its other values
// are left as set.
func TestWritersCommitDurably(t *testing.T) {
	t.Parallel()
	for set, want := range map[string]string{"off": "on", "local": "local", "on": "on"} {
		dsn := newDSN(t, testPG)
		ctx := testCtx(t)
		admin, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		_, err = admin.Exec(ctx, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = "+set+"', current_database()); END $$")
		_ = admin.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l := openLedger(t, dsn)
		m := l.NewMaterializer(MaterializerConfig{Concurrency: 1})
		conn, err := m.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var writer, reader string
		err = conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&writer)
		conn.Release()
		if err == nil {
			err = l.Pool().QueryRow(ctx, "SHOW synchronous_commit").Scan(&reader)
		}
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		if writer != want || reader != want {
			t.Errorf("synchronous_commit %s for the database: the writers' %s, the pool's %s; want %s", set, writer, reader, want)
		}
	}
}

// A server that refuses a new connection because it is full (too many
// clients, or, here, the role's connection limit) answered: a rebuild
// waiting on it is not stalled, and is not cancelled as if it were.
func TestAFullLedgerStillAnswers(t *testing.T) {
	t.Parallel()
	dsn := newDSN(t, testPG)
	l := openLedger(t, dsn)
	ctx := testCtx(t)
	role := "full_" + strings.ReplaceAll(uniqueID("r"), "-", "_")
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA public TO ` + role,
		`GRANT SELECT ON ALL TABLES IN SCHEMA public TO ` + role,
	} {
		if _, err := l.Pool().Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	roleDSN := strings.Replace(dsn, "://postgres@", "://"+role+"@", 1)
	full, err := Open(ctx, roleDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	if err := full.Answers(ctx); err != nil {
		t.Fatalf("before the limit: %v", err)
	}
	if _, err := l.Pool().Exec(ctx, `ALTER ROLE `+role+` CONNECTION LIMIT 0`); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if conn, err := pgx.Connect(ctx, roleDSN); !errors.As(err, &pgErr) || pgErr.Code != "53300" {
		if err == nil {
			_ = conn.Close(ctx)
		}
		t.Fatalf("a connection past the role's limit: %v, want too many connections (the test proves nothing)", err)
	}
	if err := full.Answers(ctx); err != nil {
		t.Fatalf("a full server: %v, want it taken as answering", err)
	}
}
