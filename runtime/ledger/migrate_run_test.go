package ledger

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// These tests set the package's migration hook: none is parallel.

// newPool is a pool on dsn that does not migrate, closed with the test.
func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// migrateBefore applies the migrations below version on pool, and no more.
func migrateBefore(t *testing.T, pool *pgxpool.Pool, version int) {
	t.Helper()
	testHookMigration = func(_ context.Context, _ pgx.Tx, v int) error {
		if v == version {
			return errors.New("not yet")
		}
		return nil
	}
	defer func() { testHookMigration = nil }()
	if err := Migrate(testCtx(t), pool); err == nil {
		t.Fatalf("the migrations below %d only: want the hook's error", version)
	}
}

// holdOrders opens a transaction on pool that has read flashsale_orders (a
// long reader: it holds the table's ACCESS SHARE lock until rolled back).
func holdOrders(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	reader, err := pool.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Rollback(context.Background()) })
	if _, err := reader.Exec(testCtx(t), `SELECT count(*) FROM flashsale_orders`); err != nil {
		t.Fatal(err)
	}
	return reader
}

// A schema upgrade outlives the Open that started it: cut at each caller's
// limit (a reconcile's phase, a pod's start), the migration of a large ledger
// would start over at every call and never finish. The caller gets
// ErrMigrating, naming the migration; the next Open waits for the same run
// instead of starting another.
func TestOpenLeavesAnUpgradeRunning(t *testing.T) {
	dsn := newDSN(t, testPG)
	release, reached := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	calls := map[int]int{}
	testHookMigration = func(_ context.Context, _ pgx.Tx, version int) error {
		mu.Lock()
		calls[version]++
		first := calls[version] == 1
		mu.Unlock()
		if version == 3 {
			if first {
				close(reached)
			}
			// Bounded, so that a run the caller's limit cuts shows it.
			select {
			case <-release:
			case <-time.After(5 * time.Second):
			}
		}
		return nil
	}
	defer func() { testHookMigration = nil }()
	// The caller's limit ends once the run is in migration 0003, whatever
	// the time the ones before took on a busy machine.
	ctx, cancel := context.WithCancelCause(testCtx(t))
	defer cancel(nil)
	go func() {
		<-reached
		cancel(context.DeadlineExceeded)
	}()
	if _, err := Open(ctx, dsn); !errors.Is(err, ErrMigrating) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Open cut during an upgrade: %v, want ErrMigrating", err)
	} else if want := "migration 0003_request_key"; !strings.Contains(err.Error(), want) {
		t.Fatalf("Open cut during an upgrade: %v, want it to name %q", err, want)
	}
	opened := make(chan error, 1)
	go func() {
		l, err := Open(testCtx(t), dsn)
		if err == nil {
			l.Close()
		}
		opened <- err
	}()
	close(release)
	if err := <-opened; err != nil {
		t.Fatalf("Open after the upgrade went on: %v", err)
	}
	l := openLedger(t, dsn)
	migs, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if n := countVersions(t, l.Pool()); n != len(migs) {
		t.Fatalf("%d versions recorded, want %d", n, len(migs))
	}
	mu.Lock()
	defer mu.Unlock()
	if calls[3] != 1 {
		t.Fatalf("migration 3 was started %d times, want once: %v", calls[3], calls)
	}
}

// Each migration commits on its own: one that fails keeps those before it.
func TestMigrationsCommitOneByOne(t *testing.T) {
	pool := newPool(t, newDSN(t, testPG))
	boom := errors.New("boom")
	testHookMigration = func(_ context.Context, _ pgx.Tx, version int) error {
		if version == 4 {
			return boom
		}
		return nil
	}
	defer func() { testHookMigration = nil }()
	if err := Migrate(testCtx(t), pool); !errors.Is(err, boom) {
		t.Fatalf("Migrate: %v, want the hook's error", err)
	}
	if n := countVersions(t, pool); n != 3 {
		t.Fatalf("%d versions recorded after migration 4 failed, want 3", n)
	}
}

// A migration that cannot get a table's lock (a long transaction holds it)
// gives up after migrationLockTimeout instead of queueing: every write of a
// live sale would queue behind its request.
func TestMigrationGivesUpWaitingForATableLock(t *testing.T) {
	pool := newPool(t, newDSN(t, testPG))
	migrateBefore(t, pool, 6)
	reader := holdOrders(t, pool)
	defer func(d time.Duration) { migrationLockTimeout = d }(migrationLockTimeout)
	migrationLockTimeout = 200 * time.Millisecond
	var pgErr *pgconn.PgError
	if err := Migrate(testCtx(t), pool); !errors.As(err, &pgErr) || pgErr.Code != lockNotAvailable {
		t.Fatalf("Migrate behind a reader: %v, want lock_not_available (55P03)", err)
	}
	if err := reader.Rollback(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(testCtx(t), pool); err != nil {
		t.Fatalf("Migrate once the reader is done: %v", err)
	}
}

// A database's statement_timeout does not cut a migration (one of millions
// of rows takes minutes): here migration 6 runs a statement longer than it.
func TestMigrationOutlivesAStatementTimeout(t *testing.T) {
	dsn := newDSN(t, testPG) + "&statement_timeout=200"
	testHookMigration = func(ctx context.Context, tx pgx.Tx, version int) error {
		if version == 6 {
			_, err := tx.Exec(ctx, `SELECT pg_sleep(0.5)`)
			return err
		}
		return nil
	}
	defer func() { testHookMigration = nil }()
	l := openLedger(t, dsn)
	if n, want := countVersions(t, l.Pool()), len(mustLoadMigrations(t)); n != want {
		t.Fatalf("%d versions recorded, want %d", n, want)
	}
}

// An upgrade whose migration cannot get its table's lock (a long
// transaction holds it) tries again on its own, every lockRetry and longer:
// the callers that time out meanwhile do not start new runs, and it finishes
// once the transaction ends.
func TestOpenWaitsOutALongTransaction(t *testing.T) {
	dsn := newDSN(t, testPG)
	pool := newPool(t, dsn)
	migrateBefore(t, pool, 6)
	reader := holdOrders(t, pool)
	var mu sync.Mutex
	tries := 0 // of migration 6, by the run
	testHookMigration = func(_ context.Context, _ pgx.Tx, version int) error {
		if version == 6 {
			mu.Lock()
			tries++
			mu.Unlock()
		}
		return nil
	}
	defer func() { testHookMigration = nil }()
	defer func(d, r time.Duration) { migrationLockTimeout, lockRetry = d, r }(migrationLockTimeout, lockRetry)
	migrationLockTimeout, lockRetry = 100*time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
	defer cancel()
	if _, err := Open(ctx, dsn); !errors.Is(err, ErrMigrating) {
		t.Fatalf("Open behind a long transaction: %v, want ErrMigrating", err)
	}
	if err := reader.Rollback(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	l := openLedger(t, dsn)
	if n, want := countVersions(t, l.Pool()), len(mustLoadMigrations(t)); n != want {
		t.Fatalf("%d versions recorded, want %d", n, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if tries < 2 {
		t.Fatalf("the run tried migration 6 %d times, want at least two (a refused try, then the one after the reader)", tries)
	}
}

// mustLoadMigrations is every migration this build carries.
func mustLoadMigrations(t *testing.T) []migration {
	t.Helper()
	migs, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	return migs
}
