package ledger

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockKey is the pg_advisory_xact_lock key that serialises Migrate
// across processes. Advisory locks are per database, so unrelated databases
// on one server do not wait for each other. The value spells "flashmig".
const migrationLockKey int64 = 0x666c6173686d6967

const (
	sqlMigrationLock = `SELECT pg_advisory_xact_lock($1)`

	// Created under the advisory lock: concurrent CREATE TABLE IF NOT EXISTS
	// can otherwise fail on the catalog's unique indexes.
	sqlCreateMigrationsTable = `CREATE TABLE IF NOT EXISTS flashsale_schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

	sqlAppliedMigrations = `SELECT version, checksum FROM flashsale_schema_migrations`

	sqlMigrationsTableExists = `SELECT to_regclass('flashsale_schema_migrations') IS NOT NULL`

	sqlRecordMigration = `INSERT INTO flashsale_schema_migrations (version, name, checksum) VALUES ($1, $2, $3)`
)

type migration struct {
	version  int
	name     string
	sql      string
	checksum string
}

// loadMigrations reads migrations/NNNN_name.sql in version order.
func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	seen := map[int]string{}
	for _, e := range entries {
		file := e.Name()
		num, name, ok := strings.Cut(strings.TrimSuffix(file, ".sql"), "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version <= 0 {
			return nil, fmt.Errorf("ledger: migration %q: want NNNN_name.sql", file)
		}
		if other, dup := seen[version]; dup {
			return nil, fmt.Errorf("ledger: migrations %q and %q share version %d", other, file, version)
		}
		seen[version] = file
		body, err := migrationFiles.ReadFile(path.Join("migrations", file))
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(body)
		out = append(out, migration{version: version, name: name, sql: string(body), checksum: hex.EncodeToString(sum[:])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// Migrate applies the embedded migrations that flashsale_schema_migrations
// does not list yet, each in a transaction of its own under an advisory lock,
// so any number of processes may call it at once: the first applies, the
// rest wait and find nothing to do, and one cut short keeps the migrations it
// finished. An applied migration whose file has since changed is an error, not
// something to paper over.
//
// A migration waits at most migrationLockTimeout for a table's lock: queued
// behind a long transaction, its request would hold up every write of a live
// sale until it got the lock. It then fails (ErrLockNotAvailable); the
// upgrade Open runs tries again later (migrateDetached).
//
// A schema that is already up to date is only read: a role without CREATE on
// the schema (the least privilege the reserve and sweeper pods need) can
// start once another has migrated.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error { return migrate(ctx, pool, nil) }

// migrate is Migrate, reporting the migration it applies to run (nil: none).
func migrate(ctx context.Context, pool *pgxpool.Pool, run *migrationRun) error {
	migs, err := loadMigrations()
	if err != nil {
		return err
	}
	if current, err := upToDate(ctx, pool, migs); err != nil || current {
		return err
	}
	for _, m := range migs {
		if err := migrateOne(ctx, pool, m, run); err != nil {
			return fmt.Errorf("ledger: migrate: %w", err)
		}
	}
	return nil
}

// migrationLockTimeout bounds each migration's wait for a table lock: the
// writes that queue behind its request wait as long (a reserve pod's ledger
// stall alarm is at 2 s).
var migrationLockTimeout = time.Second

// migrateOne applies m unless it is applied already.
func migrateOne(ctx context.Context, pool *pgxpool.Pool, m migration, run *migrationRun) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		// The advisory lock first: another process's migration is waited
		// for as long as the caller's context allows.
		if _, err := tx.Exec(ctx, sqlMigrationLock, migrationLockKey); err != nil {
			return err
		}
		// A database's or role's statement and idle limits would cut a
		// migration of millions of rows at every try.
		if _, err := tx.Exec(ctx, sqlUntimedTx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", migrationLockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlCreateMigrationsTable); err != nil {
			return err
		}
		applied, err := appliedMigrations(ctx, tx)
		if err != nil {
			return err
		}
		if sum, ok := applied[m.version]; ok {
			if sum != m.checksum {
				return changedMigration(m)
			}
			return nil
		}
		run.applying(m)
		if testHookMigration != nil {
			if err := testHookMigration(ctx, tx, m.version); err != nil {
				return err
			}
		}
		// No arguments: pgx uses the simple protocol, which runs a
		// multi-statement file as written.
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fmt.Errorf("migration %04d_%s: %w", m.version, m.name, err)
		}
		_, err = tx.Exec(ctx, sqlRecordMigration, m.version, m.name, m.checksum)
		return err
	})
}

// testHookMigration, when set by a test, runs in each migration's
// transaction before the migration; an error it returns fails that migration.
var testHookMigration func(ctx context.Context, tx pgx.Tx, version int) error

// upToDate reports, without locking or writing anything, whether every
// migration is applied as it is now; an applied one that changed is an error.
func upToDate(ctx context.Context, pool *pgxpool.Pool, migs []migration) (bool, error) {
	var exists bool
	if err := pool.QueryRow(ctx, sqlMigrationsTableExists).Scan(&exists); err != nil {
		return false, fmt.Errorf("ledger: migrate: %w", err)
	}
	if !exists {
		return false, nil
	}
	applied, err := appliedMigrations(ctx, pool)
	if err != nil {
		return false, fmt.Errorf("ledger: migrate: %w", err)
	}
	for _, m := range migs {
		sum, ok := applied[m.version]
		if !ok {
			return false, nil
		}
		if sum != m.checksum {
			return false, fmt.Errorf("ledger: migrate: %w", changedMigration(m))
		}
	}
	return true, nil
}

func changedMigration(m migration) error {
	return fmt.Errorf("migration %04d_%s was changed after it was applied", m.version, m.name)
}

// appliedMigrations reads version -> checksum.
func appliedMigrations(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) (map[int]string, error) {
	rows, err := q.Query(ctx, sqlAppliedMigrations)
	if err != nil {
		return nil, err
	}
	applied := map[int]string{}
	var v int
	var sum string
	if _, err := pgx.ForEachRow(rows, []any{&v, &sum}, func() error {
		applied[v] = sum
		return nil
	}); err != nil {
		return nil, err
	}
	return applied, nil
}
