package testharness

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// SkewClock shadows now() and clock_timestamp() in dsn's database with
// functions that add an offset, through the database's search_path, and
// returns what sets the offset, an interval ("5 seconds", "-2 s"). Only
// sessions opened after the call see the functions; every such session sees
// a new offset at once.
func SkewClock(ctx context.Context, t testing.TB, dsn string) func(string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, q := range []string{
		`CREATE SCHEMA skew`,
		`CREATE TABLE skew.offset_by (d interval NOT NULL)`,
		`INSERT INTO skew.offset_by VALUES ('0')`,
		`CREATE FUNCTION skew.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE
		 AS $$ SELECT pg_catalog.clock_timestamp() + (SELECT d FROM skew.offset_by) $$`,
		`CREATE FUNCTION skew.now() RETURNS timestamptz LANGUAGE sql STABLE
		 AS $$ SELECT pg_catalog.now() + (SELECT d FROM skew.offset_by) $$`,
		`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET search_path = public, skew, pg_catalog', current_database()); END $$`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return func(d string) {
		t.Helper()
		if _, err := conn.Exec(ctx, `UPDATE skew.offset_by SET d = $1::interval`, d); err != nil {
			t.Fatal(err)
		}
	}
}
