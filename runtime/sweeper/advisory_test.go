package sweeper

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func newLock(t *testing.T, dsn, campaign string) *AdvisoryLock {
	t.Helper()
	a, err := NewAdvisoryLock(dsn, campaign)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Release(context.Background()) })
	return a
}

func acquire(t *testing.T, a *AdvisoryLock) bool {
	t.Helper()
	ok, _ := a.Acquire(context.Background())
	return ok
}

func TestAdvisoryLockOneLeader(t *testing.T) {
	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	dsn += "&pool_max_conns=4" // the ledger's DSN may carry pool settings
	ctx := context.Background()
	a, b := newLock(t, dsn, "c-1"), newLock(t, dsn, "c-1")
	if !acquire(t, a) {
		t.Fatal("first candidate did not get the free lock")
	}
	for range 3 {
		if !acquire(t, a) {
			t.Fatal("the holder lost the lock")
		}
		if acquire(t, b) {
			t.Fatal("two leaders")
		}
	}
	// Another campaign's sweeper has its own lock.
	if !acquire(t, newLock(t, dsn, "c-2")) {
		t.Fatal("campaigns share a lock")
	}
	// Release hands over at once: the session-level lock taken once is gone
	// (pg_try_advisory_lock is reentrant, so a leak would show here).
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !acquire(t, b) {
		t.Fatal("the lock was not free after Release")
	}
	if acquire(t, a) {
		t.Fatal("two leaders after the hand-over")
	}
}

// When the lock's connection dies the server drops the lock; the old holder
// learns it at its next Acquire and another replica takes over.
func TestAdvisoryLockConnectionLoss(t *testing.T) {
	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, b := newLock(t, dsn, "c-x"), newLock(t, dsn, "c-x")
	if !acquire(t, a) {
		t.Fatal("no leader")
	}
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var killed bool
	err = admin.QueryRow(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND (classid::bigint << 32 | objid::bigint) = $1`,
		AdvisoryLockKey("c-x")).Scan(&killed)
	if err != nil || !killed {
		t.Fatalf("terminating the holder's session: %v %v", killed, err)
	}
	ok, err := a.Acquire(ctx)
	if ok || err == nil {
		t.Fatalf("the holder still leads after its connection died (%v, %v)", ok, err)
	}
	// The terminated backend releases its locks as it exits, a moment later:
	// the other replica gets the lock at one of its next tries.
	waitFor(t, "the other replica to take over", func() bool { return acquire(t, b) })
	if acquire(t, a) {
		t.Fatal("the old holder took the lock back while held")
	}
}

func TestAdvisoryLockUnreachable(t *testing.T) {
	a := newLock(t, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", "c")
	if ok, err := a.Acquire(context.Background()); ok || err == nil {
		t.Fatalf("leading without a database: %v %v", ok, err)
	}
}

// The server probes the lock's session, so a holder whose node vanished
// loses the lock within about half a minute rather than the kernel's two
// hours; values the DSN sets are its own.
func TestAdvisoryLockSessionIsProbed(t *testing.T) {
	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dsn  string
		want map[string]string
	}{
		{dsn, map[string]string{"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3", "tcp_user_timeout": "20000"}},
		{dsn + "&tcp_keepalives_idle=30", map[string]string{"tcp_keepalives_idle": "30", "tcp_keepalives_interval": "5"}},
	} {
		a := newLock(t, c.dsn, "c-probed")
		if !acquire(t, a) {
			t.Fatal("no leader")
		}
		for name, want := range c.want {
			var got string
			// In the setting's own unit (s, or ms for tcp_user_timeout).
			if err := a.conn.QueryRow(context.Background(), "SELECT setting FROM pg_settings WHERE name = $1", name).Scan(&got); err != nil || got != want {
				t.Errorf("%s: the lock's session has %s = %q (%v), want %q", c.dsn, name, got, err, want)
			}
		}
		if err := a.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// An idle_session_timeout set on the database (or the role) does not end
// the lock's session between two passes: the leader keeps leading instead
// of losing the lock, and a pass, every other time.
func TestAdvisoryLockOutlivesIdleSessionTimeout(t *testing.T) {
	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET idle_session_timeout = ''1s''', current_database()); END $$"); err != nil {
		t.Fatal(err)
	}
	a := newLock(t, dsn, "c-idle")
	if !acquire(t, a) {
		t.Fatal("no leader")
	}
	time.Sleep(2500 * time.Millisecond) // idle past the database's timeout
	if ok, err := a.Acquire(ctx); !ok || err != nil {
		t.Fatalf("after the session sat idle past idle_session_timeout: %v %v, want still leading", ok, err)
	}
}
