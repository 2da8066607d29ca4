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
// reads the synchronous settings as the ledger's sessions commit, and the
// physical slots no standby streams from.
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

	// WAL clients that are no standby: a logical receiver, a WAL archiver, a
	// base backup.
	receiver, err := pg.ReceiveLogical("postgres")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = receiver.Close() })
	archiver, err := pg.ReceiveWAL()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = archiver.Close() })
	backup, err := pg.SlowBaseBackup()
	if err != nil {
		t.Fatal(err)
	}
	if r := read("a logical receiver, pg_receivewal and a base backup"); len(r.Standbys) != 0 ||
		!slices.Equal(r.BackupClients, []Standby{{Name: "pg_basebackup"}, {Name: "pg_receivewal"}}) {
		t.Fatalf("a logical receiver, pg_receivewal and a base backup: %+v; want no standby, the two backup clients", r)
	}
	if err := backup.Close(); err != nil {
		t.Fatal(err)
	}

	for _, name := range []string{"pg-c", "pg-b"} {
		sb, err := pg.StartStandby(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sb.Close() })
	}
	set := func(stmts ...string) {
		t.Helper()
		for _, stmt := range append(stmts, `SELECT pg_reload_conf()`) {
			if _, err := admin.Pool().Exec(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
	}
	// Commits wait for a standby from here on: the settings go back before
	// the standbys stop.
	t.Cleanup(func() { set(`ALTER SYSTEM RESET synchronous_standby_names`, `ALTER SYSTEM RESET synchronous_commit`) })
	standbys := func(syncB, syncC string) []Standby {
		return []Standby{{Name: "pg-b", SyncState: syncB}, {Name: "pg-c", SyncState: syncC}}
	}
	if r := read("two standbys"); !slices.Equal(r.Standbys, standbys("", "")) {
		t.Fatalf("two standbys, read by a plain role: %+v; want pg-b and pg-c, their sync_state unseen", r)
	}
	// A reload reaches every session's next statement, not at once.
	await := func(what string, l *Ledger, ok func(Replication) bool) {
		t.Helper()
		deadline := testCtx(t)
		for {
			r, err := l.Replication(ctx)
			if err == nil && ok(r) {
				return
			}
			select {
			case <-deadline.Done():
				t.Fatalf("%s: %+v, %v", what, r, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	await("two asynchronous standbys, read by a superuser", admin, func(r Replication) bool {
		return slices.Equal(r.Standbys, standbys("async", "async"))
	})

	set(`ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 ("pg-b", "pg-c")'`, `ALTER SYSTEM SET synchronous_commit = 'local'`)
	await("the settings, read by a plain role", l, func(r Replication) bool {
		return r.SynchronousStandbyNames == `FIRST 1 ("pg-b", "pg-c")` && r.SynchronousCommit == "local" &&
			slices.Equal(r.Standbys, standbys("", ""))
	})
	await("pg-b synchronous, read by a superuser", admin, func(r Replication) bool {
		return slices.Equal(r.Standbys, standbys("sync", "potential"))
	})

	// An archiver first in the list is the synchronous one.
	set(`ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (pg_receivewal, "pg-b")'`)
	await("pg_receivewal synchronous, read by a superuser", admin, func(r Replication) bool {
		return slices.Equal(r.BackupClients, []Standby{{Name: "pg_receivewal", SyncState: "sync"}}) &&
			slices.Equal(r.Standbys, standbys("potential", "async"))
	})

	// A physical slot no client streams from is listed, to a plain role; one
	// a standby streams from is not, until the standby stops; a logical
	// slot (the receiver's) and one no client ever streamed from never are.
	for _, stmt := range []string{
		`SELECT pg_create_physical_replication_slot('pg_away', true)`,
		`SELECT pg_create_physical_replication_slot('pg_never_used')`, // no WAL reserved: no standby's place
	} {
		if _, err := admin.Pool().Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if r := read("an idle slot"); !slices.Equal(r.IdleSlots, []string{"pg_away"}) {
		t.Fatalf("an idle slot, read by a plain role: %+v; want IdleSlots [pg_away]", r)
	}
	sb, err := pg.StartStandbyWithSlot("pg-d", "pg_d")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close() })
	if r := read("a standby streaming from its slot"); !slices.Equal(r.IdleSlots, []string{"pg_away"}) || len(r.Standbys) != 3 {
		t.Fatalf("a standby streaming from its slot: %+v; want IdleSlots [pg_away] and three standbys", r)
	}
	if err := sb.Stop(); err != nil {
		t.Fatal(err)
	}
	await("the standby stopped", l, func(r Replication) bool {
		return slices.Equal(r.IdleSlots, []string{"pg_away", "pg_d"}) && len(r.Standbys) == 2
	})

	// A slot whose WAL the server removed (max_slot_wal_keep_size) is lost:
	// its standby needs a new base backup, and the slot counts for none.
	t.Cleanup(func() { set(`ALTER SYSTEM RESET max_slot_wal_keep_size`) })
	set(`ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`)
	await("the idle slots lost", l, func(r Replication) bool {
		for _, stmt := range []string{`CHECKPOINT`, `SELECT pg_switch_wal()`, `CHECKPOINT`} { // a checkpoint writes WAL to switch from
			if _, err := admin.Pool().Exec(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
		return len(r.IdleSlots) == 0
	})
}
