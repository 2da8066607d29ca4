package localenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// startServers starts Redis and PostgreSQL and creates the ledger's database.
func (e *Env) startServers(ctx context.Context, step func(string, func() error) error) error {
	if err := step("Redis", func() error {
		var err error
		e.Redis, err = testharness.StartRedis()
		return err
	}); err != nil {
		return err
	}
	return step("PostgreSQL", func() error {
		var err error
		if e.Postgres, err = testharness.StartPostgres(); err != nil {
			return err
		}
		e.DSN, err = createDatabase(ctx, e.Postgres)
		return err
	})
}

// createDatabase makes the ledger's role and database, as a DBA would.
func createDatabase(ctx context.Context, pg *testharness.Postgres) (string, error) {
	conn, err := pgx.Connect(ctx, pg.AdminDSN())
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, sql := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", pgx.Identifier{DatabaseUser}.Sanitize(), DatabasePassword),
		fmt.Sprintf("CREATE DATABASE %s OWNER %s", pgx.Identifier{DatabaseName}.Sanitize(), pgx.Identifier{DatabaseUser}.Sanitize()),
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return "", fmt.Errorf("%s: %w", sql, err)
		}
	}
	u := url.URL{
		Scheme: "postgres", User: url.UserPassword(DatabaseUser, DatabasePassword),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(pg.Port())), Path: "/" + DatabaseName,
		RawQuery: "sslmode=disable",
	}
	return u.String(), nil
}

// StartRedis starts another Redis (e.g. one to restart empty without touching
// other sales); Close stops it.
func (e *Env) StartRedis() (*testharness.Redis, error) {
	r, err := testharness.StartRedis()
	if err != nil {
		return nil, err
	}
	e.extras = append(e.extras, r)
	return r, nil
}

// StartPostgres starts another PostgreSQL with the ledger's role and
// database (e.g. one to stop without touching other sales) and returns it and
// the database's DSN from this machine; Close stops it.
func (e *Env) StartPostgres(ctx context.Context) (*testharness.Postgres, string, error) {
	pg, err := testharness.StartPostgres()
	if err != nil {
		return nil, "", err
	}
	e.extraPGs = append(e.extraPGs, pg)
	dsn, err := createDatabase(ctx, pg)
	return pg, dsn, err
}
