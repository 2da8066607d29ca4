package sweeper

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

const (
	sqlTryAdvisoryLock = `SELECT pg_try_advisory_lock($1)`
	sqlAdvisoryUnlock  = `SELECT pg_advisory_unlock($1)`
	// sqlProbeSession makes the server probe the lock's session: it drops the
	// lock only once it sees the session die, and a holder whose node vanished
	// (no FIN, no RST reaches the server) would keep it for the kernel's
	// default keepalive time, two hours, while every other replica waits.
	// Probed after 10 s idle, every 5 s, 3 misses, and unacknowledged data
	// given up after 20 s: the lock goes within about half a minute. A DSN
	// that sets any of these keeps its own values (they are sent at connect),
	// and a server without one (tcp_user_timeout is PostgreSQL 12's) is not
	// asked to set it. The session is idle between passes by design: an
	// idle_session_timeout a DBA set on the role or database (PostgreSQL
	// 14's) would end it, and the lock with it, between every two passes.
	sqlProbeSession = `SELECT set_config(name, value, false)
FROM (VALUES ('tcp_keepalives_idle', '10'), ('tcp_keepalives_interval', '5'),
             ('tcp_keepalives_count', '3'), ('tcp_user_timeout', '20000'),
             ('idle_session_timeout', '0')) AS s(name, value)
WHERE NOT name = ANY($1::text[]) AND name IN (SELECT name FROM pg_settings)`
)

// lockTimeout bounds connecting, pinging and locking: a sweeper that cannot
// reach PostgreSQL quickly is not a leader.
const lockTimeout = 5 * time.Second

// AdvisoryLockKey is the advisory lock key of a campaign's sweeper: the first
// 8 bytes of a SHA-256 of the campaign id.
func AdvisoryLockKey(campaignID string) int64 {
	sum := sha256.Sum256([]byte("flashsale sweeper " + campaignID))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// AdvisoryLock elects the sweeper with a PostgreSQL session advisory lock
// (the operator's sweeper pods use it: FLASHSALE_LEADER_LOCK=postgres). The
// lock lives on one dedicated connection
// (never a pooled one, which could be handed to someone else with the lock
// still on it); when that connection dies the server drops the lock, and this
// side notices at its next Acquire and stops leading.
type AdvisoryLock struct {
	cfg *pgx.ConnConfig
	key int64

	mu   sync.Mutex
	conn *pgx.Conn
	held bool
}

// NewAdvisoryLock parses dsn (the ledger's, pool parameters allowed) and
// prepares the lock of campaignID. It does not connect yet.
func NewAdvisoryLock(dsn, campaignID string) (*AdvisoryLock, error) {
	pc, err := pgxpool.ParseConfig(dsn) // drops pool_* parameters a plain connection would send to the server
	if err != nil {
		return nil, fmt.Errorf("advisory lock: parse dsn: %w", err)
	}
	cfg := pc.ConnConfig
	ledger.ConnectReadWrite(cfg, dsn)
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "flashsale-sweeper-lock"
	}
	return &AdvisoryLock{cfg: cfg, key: AdvisoryLockKey(campaignID)}, nil
}

// Kind implements Elector.
func (a *AdvisoryLock) Kind() string { return "advisory-lock" }

// Acquire confirms a held lock (its connection still answers) or tries to
// take it (pg_try_advisory_lock never waits).
func (a *AdvisoryLock) Acquire(ctx context.Context) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	if a.held {
		err := a.conn.Ping(ctx)
		if err == nil {
			return true, nil
		}
		a.drop()
		return false, fmt.Errorf("advisory lock connection lost, leadership with it: %w", err)
	}
	if a.conn == nil {
		c, err := pgx.ConnectConfig(ctx, a.cfg)
		if err != nil {
			return false, fmt.Errorf("advisory lock: connect: %w", err)
		}
		if _, err := c.Exec(ctx, sqlProbeSession, slices.Collect(maps.Keys(a.cfg.RuntimeParams))); err != nil {
			_ = c.Close(ctx)
			return false, fmt.Errorf("advisory lock: setting the session's keepalives: %w", err)
		}
		a.conn = c
	}
	var ok bool
	if err := a.conn.QueryRow(ctx, sqlTryAdvisoryLock, a.key).Scan(&ok); err != nil {
		a.drop()
		return false, fmt.Errorf("advisory lock: %w", err)
	}
	a.held = ok
	return ok, nil
}

// Release unlocks and closes the connection (closing alone would release
// the lock too; the explicit unlock makes the hand-over immediate even when a
// proxy keeps the server session open).
func (a *AdvisoryLock) Release(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil {
		return nil
	}
	var err error
	if a.held {
		var ok bool
		err = a.conn.QueryRow(ctx, sqlAdvisoryUnlock, a.key).Scan(&ok)
	}
	a.drop()
	return err
}

// drop closes the connection; the server releases any lock held on it.
func (a *AdvisoryLock) drop() {
	if a.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = a.conn.Close(ctx)
		cancel()
	}
	a.conn, a.held = nil, false
}
