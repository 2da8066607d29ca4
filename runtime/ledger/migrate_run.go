package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrMigrating means the ledger's schema is being upgraded and the caller
// stopped waiting: the upgrade goes on, and a later Open finds it done or
// waits for it again.
var ErrMigrating = errors.New("the ledger's schema is being upgraded")

// MigrationTimeout bounds a schema upgrade started by Open. Far above the
// callers' own limits (a reconcile's phase, a pod's start): a migration of a
// ledger of millions of orders takes minutes, and cut at each caller's limit
// it would start over at every call and never finish.
const MigrationTimeout = time.Hour

// migrationRun is a schema upgrade running in this process.
type migrationRun struct {
	done    chan struct{}
	err     error // once done is closed
	started time.Time
	step    atomic.Pointer[string] // the migration being applied
	waiting atomic.Pointer[string] // why it waits to try again, if it does
}

func (r *migrationRun) applying(m migration) {
	if r != nil {
		s := fmt.Sprintf("%04d_%s", m.version, m.name)
		r.step.Store(&s)
	}
}

// migrations are the schema upgrades running in this process, by connection
// string: one per ledger, whoever asked first.
var migrations sync.Map

// migrateDetached brings the schema of the ledger cfg connects to up to date,
// on connections of its own and a context that only MigrationTimeout ends: a
// caller that stops waiting (its ctx ends) gets ErrMigrating, and the upgrade
// goes on without it. A caller that comes while one runs waits for that one.
func migrateDetached(ctx context.Context, cfg *pgxpool.Config) error {
	key := cfg.ConnString()
	run := &migrationRun{done: make(chan struct{}), started: time.Now()}
	if cur, loaded := migrations.LoadOrStore(key, run); loaded {
		run = cur.(*migrationRun)
	} else {
		go func() {
			mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), MigrationTimeout)
			defer cancel()
			pcfg := cfg.Copy()
			pcfg.MaxConns = 2 // the read of what is applied, and the migration's transaction
			pool, err := pgxpool.NewWithConfig(mctx, pcfg)
			if err == nil {
				err = migrateRetrying(mctx, pool, run)
				pool.Close()
			}
			run.err = err
			migrations.Delete(key)
			close(run.done)
		}()
	}
	select {
	case <-run.done:
		return run.err
	case <-ctx.Done():
		step := "reading what is applied"
		if s := run.step.Load(); s != nil {
			step = "migration " + *s
		}
		if w := run.waiting.Load(); w != nil {
			step += ", " + *w
		}
		return fmt.Errorf("ledger: migrate: %w (%s, for %s; it goes on): %w",
			ErrMigrating, step, time.Since(run.started).Round(time.Second), ctx.Err())
	}
}

// lockNotAvailable is the SQLSTATE of a lock_timeout.
const lockNotAvailable = "55P03"

// lockRetry is how long an upgrade waits before it tries again a migration
// that could not get a table's lock, doubling up to lockRetryMax: each try
// holds up the table's writes for up to migrationLockTimeout.
var lockRetry, lockRetryMax = 5 * time.Second, time.Minute

// migrateRetrying is migrate, tried again while a migration cannot get a
// table's lock (a long transaction holds it), until ctx ends.
func migrateRetrying(ctx context.Context, pool *pgxpool.Pool, run *migrationRun) error {
	wait := lockRetry
	for {
		err := migrate(ctx, pool, run)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != lockNotAvailable {
			return err
		}
		w := fmt.Sprintf("waiting for a transaction that holds its table's lock (tried again every %s)", wait)
		run.waiting.Store(&w)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		run.waiting.Store(nil)
		wait = min(2*wait, lockRetryMax)
	}
}
