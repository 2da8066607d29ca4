package ledger

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// Replication lists the physical standbys streaming from the ledger's
// server, by name, to a role with no monitoring privilege, and leaves out a
// logical walsender (a change-data-capture consumer) and a base backup; it
// reads the synchronous settings as the ledger's sessions commit.
func TestReplicationListsStandbys(t *testing.T) {
	t.Parallel()
	// Its own server: a standby and wal_level=logical are the server's.
	pg, err := testharness.StartPostgresArgs("wal_level=logical")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Close() })
	dsn := newDSN(t, pg)
	admin := openLedger(t, dsn) // migrates as the superuser
	ctx := testCtx(t)
	role := "plain_" + strings.ReplaceAll(uniqueID("r"), "-", "_")
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO ` + role,
		`GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO ` + role,
	} {
		if _, err := admin.Pool().Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	l := openLedger(t, strings.Replace(dsn, "://postgres@", "://"+role+"@", 1))

	read := func(what string) Replication {
		t.Helper()
		r, err := l.Replication(ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return r
	}
	if r := read("no standby"); len(r.Standbys) != 0 || r.SynchronousStandbyNames != "" || r.SynchronousCommit != "on" {
		t.Fatalf("no standby: %+v; want none, no synchronous standby names, synchronous_commit on", r)
	}

	receiver, err := pg.ReceiveLogical("postgres")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = receiver.Close() })
	if r := read("a logical receiver"); len(r.Standbys) != 0 {
		t.Fatalf("a logical receiver counted as a standby: %+v", r)
	}
	backup, err := pg.SlowBaseBackup()
	if err != nil {
		t.Fatal(err)
	}
	if r := read("a base backup"); len(r.Standbys) != 0 {
		t.Fatalf("a base backup counted as a standby: %+v", r)
	}
	if err := backup.Close(); err != nil {
		t.Fatal(err)
	}

	for _, name := range []string{"pg-b", "pg-c"} {
		sb, err := pg.StartStandby(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sb.Close() })
	}
	if r := read("two standbys"); !slices.Equal(r.Standbys, []string{"pg-b", "pg-c"}) {
		t.Fatalf("two standbys: %+v; want pg-b and pg-c", r)
	}

	for _, stmt := range []string{
		`ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 ("pg-b", "pg-c")'`,
		`ALTER SYSTEM SET synchronous_commit = 'local'`,
		`SELECT pg_reload_conf()`,
	} {
		if _, err := admin.Pool().Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	// A reload reaches every session's next statement, not at once.
	deadline := testCtx(t)
	for {
		r := read("synchronous, commits local")
		if r.SynchronousStandbyNames == `ANY 1 ("pg-b", "pg-c")` && r.SynchronousCommit == "local" {
			break
		}
		select {
		case <-deadline.Done():
			t.Fatalf("after the reload: %+v; want the standby names and synchronous_commit local", r)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
