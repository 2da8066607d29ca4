// Package ledger is the PostgreSQL book of record: campaigns, orders, late payments, allocation changes.
//
// Redis holds the contended stock counters; this package holds what must
// survive Redis: every acknowledged reservation (written by the group-commit
// Materializer before the API answers), its checkout or cancellation, and the
// campaign epoch that fences writes against a rebuilt Redis.
package ledger

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Status is the state of an order row.
type Status string

// Order statuses, stored verbatim in flashsale_orders.status.
const (
	StatusPending            Status = "PENDING"
	StatusCommitted          Status = "COMMITTED"
	StatusCancelledBySweeper Status = "CANCELLED_BY_SWEEPER"
	StatusCancelledByUser    Status = "CANCELLED_BY_USER"
	StatusAbandoned          Status = "ABANDONED"
)

// Sentinel errors; returned errors wrap them, so test with errors.Is.
var (
	// ErrNotFound: no such order.
	ErrNotFound = errors.New("ledger: not found")
	// ErrFenced: the campaign epoch moved on (or the campaign is missing or
	// deleted); the row was definitely not written.
	ErrFenced = errors.New("ledger: fenced by campaign epoch")
	// ErrDuplicate: a row with this reservation id already existed; this call
	// did not write it.
	ErrDuplicate = errors.New("ledger: duplicate reservation")
	// ErrAmbiguous: COMMIT itself failed, so the row may or may not exist.
	ErrAmbiguous = errors.New("ledger: commit outcome unknown")
	// ErrCampaignNotFound: no such campaign (or it is deleted, where that matters).
	ErrCampaignNotFound = errors.New("ledger: campaign not found")
	// ErrAllocationDecrease: PlanAllocationIncrease was asked to lower the allocation.
	ErrAllocationDecrease = errors.New("ledger: allocation decrease")
	// ErrClosed: Submit after the Materializer was closed.
	ErrClosed = errors.New("ledger: materializer closed")
	// ErrNotSent: the caller's context ended before its row was sent; not
	// written, and nothing is known of PostgreSQL.
	ErrNotSent = errors.New("not sent")
	// ErrBadDSN: the connection string cannot be parsed. Its message never
	// quotes the connection string.
	ErrBadDSN = errors.New("ledger: the DSN cannot be parsed")
)

// DefaultMaxConns covers the materializer workers plus checkout, cancel and
// sweeper traffic of one process without letting a fleet of replicas exhaust
// PostgreSQL's max_connections.
const DefaultMaxConns = 32

// defaultApplicationName names the ledger's connections in pg_stat_activity
// unless the DSN names them; the group-commit writer's add "-writer".
const defaultApplicationName = "flashsale-ledger"

// defaultConnectTimeout bounds one connection attempt when the DSN does not
// set connect_timeout: without it, a PostgreSQL host that drops packets holds
// the caller for the kernel's TCP timeout (minutes).
const defaultConnectTimeout = 10 * time.Second

// sqlUntimedTx lifts, for one transaction, the time limits a database or role
// may set, for the work that outlives them: a rebuild's start (its cancel of
// the expired orders) and read (each query
// streams while Redis is written, and the transaction that exported the
// snapshot waits idle for the other readers) and a migration of millions of
// rows. Cut, either would fail at every retry: the sale closed, the upgrade
// never done. What bounds them instead is the peers' liveness: the server
// probes the session (a vanished operator's open snapshot would otherwise be
// held for the kernel's two hours of keepalive idle time), as the client
// probes the server (Open's dialer). Settings a server lacks
// (transaction_timeout is PostgreSQL 17's) are not asked for.
const sqlUntimedTx = `SELECT set_config(name, value, true)
FROM (VALUES ('statement_timeout', '0'), ('idle_in_transaction_session_timeout', '0'),
             ('transaction_timeout', '0'), ('tcp_keepalives_idle', '10'),
             ('tcp_keepalives_interval', '5'), ('tcp_keepalives_count', '3'),
             ('tcp_user_timeout', '20000')) AS s(name, value)
WHERE name IN (SELECT name FROM pg_settings)`

// Ledger is a handle on the book of record. It is safe for concurrent use.
type Ledger struct {
	pool *pgxpool.Pool
	// cfg is pool's configuration, from which a Materializer makes the pool
	// of its own (NewMaterializer).
	cfg *pgxpool.Config

	statsMu    sync.Mutex
	statsSeen  bool      // ensureStatistics found or made the orders' statistics
	statsRetry time.Time // after a failure, when ensureStatistics tries again
}

// Option tunes Open.
type Option func(*pgxpool.Config)

// WithMaxConns caps the pool unless the DSN sets pool_max_conns: the controller
// holds one pool per FlashSale and needs few connections for each.
func WithMaxConns(n int32) Option {
	return func(c *pgxpool.Config) { c.MaxConns = n }
}

// Open connects to dsn, checks the connection and applies migrations. The
// pool holds DefaultMaxConns connections unless the DSN sets pool_max_conns;
// a Materializer's writers have connections of their own besides
// (NewMaterializer).
// A schema upgrade outlives ctx (see migrateDetached): a ledger of millions of
// orders takes minutes, and ctx's end then fails Open with ErrMigrating.
func Open(ctx context.Context, dsn string, opts ...Option) (*Ledger, error) {
	cfg, err := poolConfig(dsn, opts...)
	if err != nil {
		return nil, err
	}
	if cfg.ConnConfig.ConnectTimeout == 0 { // not in the DSN nor PGCONNECT_TIMEOUT
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	// A server that vanishes (a failover, a partition: no FIN, no RST) is
	// noticed in about 25 s, not after the default's 15 s of keepalive idle
	// time and 9 probes 15 s apart: a query in flight, such as a rebuild's
	// read, would wait that long.
	dialer := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}}
	cfg.ConnConfig.DialFunc = dialer.DialContext
	ConnectReadWrite(cfg.ConnConfig, dsn)
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = defaultApplicationName
	}
	durableSessions(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("ledger: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, failed("ping", err)
	}
	migs, err := loadMigrations()
	if err != nil {
		pool.Close()
		return nil, err
	}
	current, err := upToDate(ctx, pool, migs)
	if err == nil && !current {
		err = migrateDetached(ctx, cfg)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &Ledger{pool: pool, cfg: cfg}, nil
}

// PoolSize is the most connections the pool Open makes for dsn holds, known
// before connecting (a process sizes what it keeps for them first).
func PoolSize(dsn string, opts ...Option) (int, error) {
	cfg, err := poolConfig(dsn, opts...)
	if err != nil {
		return 0, err
	}
	return int(cfg.MaxConns), nil
}

func poolConfig(dsn string, opts ...Option) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, parseError(err)
	}
	// ParseConfig fills a CPU-based default that cannot be told apart from an
	// explicit setting, so look at the DSN itself.
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
		for _, o := range opts {
			o(cfg)
		}
	}
	return cfg, nil
}

// Close closes the pool. Close any Materializer first.
func (l *Ledger) Close() { l.pool.Close() }

// Pool exposes the connection pool (health checks, ad-hoc queries in tests).
func (l *Ledger) Pool() *pgxpool.Pool { return l.pool }

// parseError says why a DSN cannot be parsed without quoting it: pgx quotes
// it with a best-effort redaction of the password (one written as
// "password = x", with spaces, is missed), and the message reaches logs and
// the FlashSale's status.
func parseError(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return ErrBadDSN
	}
	bare := *pe
	bare.ConnString = ""
	why := strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
	// The cause may quote a piece of the DSN: pgx's `missing "=" after
	// "horse"` is a word of a password with spaces in it, and net/url quotes
	// the URL. It is kept only when it quotes nothing.
	if cause := pe.Unwrap(); cause != nil && strings.ContainsAny(cause.Error(), "\"'`%") {
		why = strings.TrimSuffix(why, " ("+cause.Error()+")")
	}
	if pe.ConnString != "" && strings.Contains(why, pe.ConnString) {
		return ErrBadDSN
	}
	return fmt.Errorf("%w: %s", ErrBadDSN, why)
}
