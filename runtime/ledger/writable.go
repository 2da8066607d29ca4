package ledger

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrReadOnly: PostgreSQL answers but takes no writes: a standby, or a
// primary with default_transaction_read_only on (demoted in a switchover,
// or made read-only by an administrator).
var ErrReadOnly = errors.New("ledger: PostgreSQL takes no writes (a standby, or default_transaction_read_only is on)")

// readOnlyTransaction is PostgreSQL's SQLSTATE for a write refused by a
// read-only transaction.
const readOnlyTransaction = "25006"

// ConnectReadWrite makes every connection of cfg go to a server that takes
// writes (the ledger's pools; the sweeper's lock, which cannot be taken on
// a standby), unless the DSN, a service file or PGTARGETSESSIONATTRS says
// which to pick: with a DSN naming several hosts (a Patroni cluster without
// a virtual IP), a connection opened after a failover otherwise lands on a
// standby, where reads work and every write is refused. A connection
// refused a write for being read-only is closed, so that the pool opens its
// next one on the server that takes writes now (a demoted primary keeps its
// sessions).
func ConnectReadWrite(cfg *pgx.ConnConfig, dsn string) {
	// A target a service file or the DSN sets is its own.
	if cfg.ValidateConnect == nil && !strings.Contains(dsn, "target_session_attrs") && os.Getenv("PGTARGETSESSIONATTRS") == "" {
		cfg.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	}
	prev := cfg.OnPgError
	cfg.OnPgError = func(c *pgconn.PgConn, e *pgconn.PgError) bool {
		if e.Code == readOnlyTransaction {
			return false // closed: the caller still gets the error
		}
		return prev == nil || prev(c, e)
	}
}

// ReadOnly tells whether err says that the server takes no writes: a write
// refused (25006), a connection refused as read-only, or ErrReadOnly.
func ReadOnly(err error) bool {
	var pe *pgconn.PgError
	return errors.Is(err, ErrReadOnly) || errors.Is(err, pgconn.ErrReadOnlyConnection) ||
		errors.As(err, &pe) && pe.Code == readOnlyTransaction
}

// failed is err of op, as ErrReadOnly when it says the server takes no
// writes.
func failed(op string, err error) error {
	if ReadOnly(err) {
		return fmt.Errorf("%w: %v", ErrReadOnly, err)
	}
	return fmt.Errorf("ledger: %s: %w", op, err)
}

// Ping checks that PostgreSQL answers and takes writes: a ledger that
// answers reads alone cannot record a reservation. A connection found
// read-only is closed, as one refused a write is: the next one opens on the
// server that takes writes, if the DSN reaches one.
func (l *Ledger) Ping(ctx context.Context) error {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return failed("ping", err)
	}
	defer conn.Release()
	var ro string
	err = conn.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro)
	switch {
	case err != nil:
		return failed("ping", err)
	case ro == "on":
		_ = conn.Conn().Close(ctx) // the pool drops it on release
		return ErrReadOnly
	}
	return nil
}

// Answers checks that the server answers a query on a new connection of
// its own, outside the pool: one whose connections all wait on a long
// statement still answers, one that stopped answering does not. An error
// the server sends is an answer: one that refuses the connection (too many
// clients, a role's connection limit) is there, and busy.
func (l *Ledger) Answers(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, l.pool.Config().ConnConfig.Copy())
	if _, ok := errors.AsType[*pgconn.PgError](err); ok {
		return nil
	}
	if err != nil {
		return failed("new connection", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		return failed("new connection", err)
	}
	return nil
}

// ProbeWrite checks, on a writer's own connection, that a batch would be
// written now: the server takes writes, nothing holds a lock a batch waits
// for (the campaign's row, the orders table), and a commit that writes WAL
// returns (one hangs on a full disk, or with a synchronous standby gone).
// It changes no row. A ledger that only answers a ping can still hang or
// refuse every batch.
func (m *Materializer) ProbeWrite(ctx context.Context, campaignID string) error {
	conn, err := m.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("ledger: probe: no connection: %w", err)
	}
	defer conn.Release()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, q := range []struct {
			sql  string
			args []any
		}{
			// Bounded on the server too: a probe given up by its caller
			// must not go on waiting there, holding the campaign's row.
			{"SELECT set_config('lock_timeout', '1s', true), set_config('statement_timeout', '1s', true)", nil},
			{"SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR SHARE", []any{campaignID}},
			{"LOCK TABLE flashsale_orders IN ROW EXCLUSIVE MODE", nil},
			{"SELECT txid_current()", nil}, // the commit writes WAL, as a batch's does
		} {
			if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return failed("probe", err)
	}
	return nil
}

// sqlDurableCommits turns synchronous_commit back on in a session when the
// role or database turned it off: a 201 says the reservation is durable, and
// a checkout's answer that the order is paid, and with it off a commit
// returns before its WAL is flushed (a crash of PostgreSQL loses it). Its
// other values (local, remote_write, remote_apply) flush locally, and are the
// operator's choice.
const sqlDurableCommits = `SELECT set_config('synchronous_commit', 'on', false)
WHERE current_setting('synchronous_commit') = 'off'`

// onConnect runs step on each connection of cfg when it opens, after what
// cfg ran there already.
func onConnect(cfg *pgxpool.Config, step func(ctx context.Context, c *pgx.Conn) error) {
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if prev != nil {
			if err := prev(ctx, c); err != nil {
				return err
			}
		}
		return step(ctx, c)
	}
}

// durableSessions makes every connection of cfg commit durably when it opens
// (sqlDurableCommits): the writers' batches, and the checkouts, cancels and
// sweeps of the ledger's own pool.
func durableSessions(cfg *pgxpool.Config) {
	onConnect(cfg, func(ctx context.Context, c *pgx.Conn) error {
		if _, err := c.Exec(ctx, sqlDurableCommits); err != nil {
			return fmt.Errorf("ledger: the session's synchronous_commit: %w", err)
		}
		return nil
	})
}

// writerSessions readies a writer connection when it opens (its commits are
// durable already, durableSessions): its statements prepared, so that a batch
// whose deadline ends while its statement is still being prepared is not
// "outcome unknown" (ErrAmbiguous) with its insert never sent, its units
// held until they expire. Nothing is prepared with a DSN that asks for
// another query mode than pgx's default (a pooler in transaction mode keeps
// no prepared statement).
func writerSessions(cfg *pgxpool.Config) {
	if cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return
	}
	onConnect(cfg, func(ctx context.Context, c *pgx.Conn) error {
		for _, q := range []string{sqlInsertPending, sqlInsertPendingSkipDuplicates} {
			if _, err := c.Prepare(ctx, q, q); err != nil {
				return fmt.Errorf("ledger: preparing the writer's statements: %w", err)
			}
		}
		return nil
	})
}
