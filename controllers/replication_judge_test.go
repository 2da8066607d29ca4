package controllers

import (
	"slices"
	"strings"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// judgeReplication: safe with no standby, or with commits waiting for the
// named synchronous standbys; not safe when standbys stream asynchronously,
// when commits are local, or when sync_state shows a backup client standing
// for a standby or no standby named; a standby catching up is a candidate.
// The message names the standbys.
func TestJudgeReplication(t *testing.T) {
	named := func(names ...string) []engine.Standby {
		var out []engine.Standby
		for _, n := range names {
			name, sync, _ := strings.Cut(n, " ")
			out = append(out, engine.Standby{Name: name, SyncState: sync})
		}
		return out
	}
	for _, c := range []struct {
		name   string
		rep    engine.Replication
		safe   bool
		reason string
		says   string
	}{
		{"no standby", engine.Replication{SynchronousCommit: "on"}, true, ReasonNoStandby,
			"PostgreSQL streams its WAL to no standby"},
		{"no standby, local commits", engine.Replication{SynchronousStandbyNames: "pg-b", SynchronousCommit: "local"}, true, ReasonNoStandby,
			"no standby"},
		{"one asynchronous standby", engine.Replication{Standbys: named("pg-b"), SynchronousCommit: "on"}, false, ReasonAsynchronousStandby,
			"PostgreSQL streams asynchronously (synchronous_standby_names is empty) to 1 standby (pg-b): a commit returns before any standby has it, so a failover to one loses the last reservations and payments the sale answered for (a paid order is PENDING again, and a rebuild sells its unit twice); make the replication synchronous, or never promote it"},
		{"many asynchronous standbys", engine.Replication{Standbys: named("a", "b", "c", "d", "e", "f", "g"), SynchronousCommit: "on"}, false, ReasonAsynchronousStandby,
			"streams asynchronously (synchronous_standby_names is empty) to 7 standbys (a, b, c, d, e and 2 more)"},
		{"synchronous, sync_state unseen", engine.Replication{Standbys: named("pg-b", "pg-c"), SynchronousStandbyNames: `ANY 1 ("pg-b", "pg-c")`, SynchronousCommit: "on"}, true, ReasonSynchronousStandby,
			`PostgreSQL streams to 2 standbys (pg-b, pg-c), and a commit waits for synchronous_standby_names ANY 1 ("pg-b", "pg-c") (synchronous_commit on)`},
		{"synchronous, sync_state seen", engine.Replication{Standbys: named("pg-b sync", "pg-c potential"), SynchronousStandbyNames: `FIRST 1 ("pg-b", "pg-c")`, SynchronousCommit: "on"}, true, ReasonSynchronousStandby,
			`PostgreSQL streams to 2 standbys (pg-b sync, pg-c potential), and a commit waits`},
		{"quorum", engine.Replication{Standbys: named("pg-b quorum", "pg-c quorum"), SynchronousStandbyNames: `ANY 1 (*)`, SynchronousCommit: "on"}, true, ReasonSynchronousStandby,
			"(pg-b quorum, pg-c quorum)"},
		{"synchronous, remote_write", engine.Replication{Standbys: named("pg-b"), SynchronousStandbyNames: "*", SynchronousCommit: "remote_write"}, true, ReasonSynchronousStandby,
			"(synchronous_commit remote_write)"},
		{"a backup client synchronous first", engine.Replication{Standbys: named("pg-b potential"), BackupClients: named("pg_receivewal sync"),
			SynchronousStandbyNames: `FIRST 1 (pg_receivewal, "pg-b")`, SynchronousCommit: "on"}, false, ReasonAsynchronousStandby,
			`synchronous_standby_names FIRST 1 (pg_receivewal, "pg-b") lets a client that is no failover target (a backup tool's, or one the sale's flashsale.dev/ledger-standbys-never-promoted annotation names) stand for a standby (pg_receivewal sync): a commit may return once only it has the commit, before the 1 standby (pg-b potential) PostgreSQL streams to`},
		{"a backup client in the quorum", engine.Replication{Standbys: named("pg-b quorum"), BackupClients: named("barman_receive_wal quorum"),
			SynchronousStandbyNames: `ANY 1 (barman_receive_wal, "pg-b")`, SynchronousCommit: "on"}, false, ReasonAsynchronousStandby,
			"(barman_receive_wal quorum)"},
		{"a backup client not synchronous", engine.Replication{Standbys: named("pg-b sync"), BackupClients: named("pg_receivewal async"),
			SynchronousStandbyNames: `"pg-b"`, SynchronousCommit: "on"}, true, ReasonSynchronousStandby, "(pg-b sync)"},
		{"none of the standbys named", engine.Replication{Standbys: named("pg-b async", "pg-c async"), SynchronousStandbyNames: `"pg-x"`, SynchronousCommit: "on"}, false, ReasonAsynchronousStandby,
			`synchronous_standby_names "pg-x" names none of the 2 standbys (pg-b async, pg-c async) PostgreSQL streams to: a commit waits for none of them, so a failover to one loses the last reservations and payments the sale answered for (a paid order is PENDING again, and a rebuild sells its unit twice); name them (by application_name) in it`},
		{"a standby catching up, none synchronous: commits wait", engine.Replication{Standbys: named("pg-b potential"), SynchronousStandbyNames: `"pg-b"`, SynchronousCommit: "on"}, true, ReasonSynchronousStandby,
			"(pg-b potential)"},
		{"local commits", engine.Replication{Standbys: named("pg-b"), SynchronousStandbyNames: "pg-b", SynchronousCommit: "local"}, false, ReasonLocalCommit,
			"synchronous_commit is local: a commit returns without waiting for the synchronous standbys (synchronous_standby_names pg-b) of the 1 standby (pg-b) PostgreSQL streams to"},
		// A standby away (restarting, cut off) keeps its slot: the verdict
		// holds until it streams again.
		{"a standby away, asynchronous", engine.Replication{IdleSlots: []string{"pg_b"}, SynchronousCommit: "on"}, false, ReasonAsynchronousStandby,
			"No standby streams from PostgreSQL now, but 1 is away (its slot pg_b idle), and synchronous_standby_names is empty: a commit returns before any standby has it, so a failover to one loses the last reservations and payments the sale answered for (a paid order is PENDING again, and a rebuild sells its unit twice); make the replication synchronous, or never promote it; drop a slot no standby will use again (it also holds WAL back)"},
		{"one streaming and two away, asynchronous", engine.Replication{Standbys: named("pg-b"), IdleSlots: []string{"pg_c", "pg_d"}, SynchronousCommit: "on"}, false, ReasonAsynchronousStandby,
			"PostgreSQL streams asynchronously (synchronous_standby_names is empty) to 1 standby (pg-b), 2 more away (their slots pg_c, pg_d idle): a commit returns before any standby has it, so a failover to one loses the last reservations and payments the sale answered for (a paid order is PENDING again, and a rebuild sells its unit twice); make the replication synchronous, or never promote them;"},
		{"the synchronous standby away: commits wait", engine.Replication{IdleSlots: []string{"pg_b"}, SynchronousStandbyNames: `"pg-b"`, SynchronousCommit: "on"}, true, ReasonSynchronousStandby,
			`No standby streams from PostgreSQL now, but 1 is away (its slot pg_b idle), and a commit waits for synchronous_standby_names "pg-b" (synchronous_commit on): commits wait until a standby streams again`},
		{"one synchronous, one away", engine.Replication{Standbys: named("pg-b sync"), IdleSlots: []string{"pg_c"}, SynchronousStandbyNames: `ANY 1 (*)`, SynchronousCommit: "on"}, true, ReasonSynchronousStandby,
			`PostgreSQL streams to 1 standby (pg-b sync), 1 more away (its slot pg_c idle), and a commit waits for synchronous_standby_names ANY 1 (*) (synchronous_commit on)`},
		{"a standby away, local commits", engine.Replication{IdleSlots: []string{"pg_b", "pg_c"}, SynchronousStandbyNames: `"pg-b"`, SynchronousCommit: "local"}, false, ReasonLocalCommit,
			`(synchronous_standby_names "pg-b") of the 2 standbys away (their slots pg_b, pg_c idle), so`},
		{"none named, one away", engine.Replication{Standbys: named("pg-b async"), IdleSlots: []string{"pg_c"}, SynchronousStandbyNames: `"pg-x"`, SynchronousCommit: "on"}, false, ReasonAsynchronousStandby,
			`synchronous_standby_names "pg-x" names none of the 1 standby (pg-b async) PostgreSQL streams to; unless it names one of the 1 away (its slot pg_c idle), whose return commits then wait for, a commit waits for no standby, so a failover`},
		{"a backup client synchronous, the standby away", engine.Replication{BackupClients: named("pg_receivewal sync"), IdleSlots: []string{"pg_b"},
			SynchronousStandbyNames: `FIRST 1 (pg_receivewal, "pg-b")`, SynchronousCommit: "on"}, false, ReasonAsynchronousStandby,
			"before the 1 standby away (its slot pg_b idle), so"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := judgeReplication(c.rep)
			if v.safe != c.safe || v.reason != c.reason || !strings.Contains(v.message, c.says) {
				t.Fatalf("%+v: got safe %v, %s: %q; want safe %v, %s, saying %q", c.rep, v.safe, v.reason, v.message, c.safe, c.reason, c.says)
			}
		})
	}
}

// neverPromoted: the standbys the annotation names (trimmed, comma-separated)
// are no failover target, and count as backup clients do; the idle slots it
// names are no standby away.
func TestNeverPromoted(t *testing.T) {
	r := engine.Replication{
		Standbys:                []engine.Standby{{Name: "pg-b", SyncState: "sync"}, {Name: "reporting", SyncState: "async"}},
		BackupClients:           []engine.Standby{{Name: "pg_receivewal", SyncState: "async"}},
		SynchronousStandbyNames: `"pg-b"`, SynchronousCommit: "on",
	}
	for _, c := range []struct {
		names          string
		standbys, not  string
		safe           bool
		reason, saying string
	}{
		{"", "pg-b sync, reporting async", "pg_receivewal async", true, ReasonSynchronousStandby, "2 standbys (pg-b sync, reporting async)"},
		{" reporting ,other", "pg-b sync", "pg_receivewal async, reporting async", true, ReasonSynchronousStandby, "1 standby (pg-b sync)"},
		{"pg-b,reporting", "", "pg_receivewal async, pg-b sync, reporting async", true, ReasonNoStandby,
			"(it streams to pg_receivewal async, pg-b sync, reporting async, no failover target)"},
	} {
		got := neverPromoted(r, c.names)
		v := judgeReplication(got)
		if listed(got.Standbys) != c.standbys || listed(got.BackupClients) != c.not || v.safe != c.safe || v.reason != c.reason || !strings.Contains(v.message, c.saying) {
			t.Errorf("%q: standbys %q, not %q, %v %s %q; want %q, %q, %v %s saying %q",
				c.names, listed(got.Standbys), listed(got.BackupClients), v.safe, v.reason, v.message, c.standbys, c.not, c.safe, c.reason, c.saying)
		}
	}
	if listed(r.BackupClients) != "pg_receivewal async" {
		t.Errorf("neverPromoted changed its argument's backup clients: %q", listed(r.BackupClients))
	}

	// A backup tool's idle slot, named, is no standby away.
	r = engine.Replication{IdleSlots: []string{"barman", "pg_c"}, SynchronousCommit: "on"}
	if got := neverPromoted(r, "barman"); !slices.Equal(got.IdleSlots, []string{"pg_c"}) || !slices.Equal(r.IdleSlots, []string{"barman", "pg_c"}) {
		t.Errorf("the slot barman named: idle slots %q, its argument's %q; want [pg_c], [barman pg_c]", got.IdleSlots, r.IdleSlots)
	}
	if v := judgeReplication(neverPromoted(r, "pg_c, barman")); v.reason != ReasonNoStandby {
		t.Errorf("both slots named: %s %q; want %s", v.reason, v.message, ReasonNoStandby)
	}
	// A replica named by its application_name keeps no failover target while
	// it restarts: its slot, named after it as Patroni names it, is dropped
	// too; a name that only looks alike is not.
	for names, want := range map[string][]string{"pg-c": {"barman"}, "PG.C,barman": {}, "pg-cc": {"barman", "pg_c"}, "pgc": {"barman", "pg_c"}} {
		if got := neverPromoted(r, names); !slices.Equal(got.IdleSlots, want) {
			t.Errorf("%q named: idle slots %q, want %q", names, got.IdleSlots, want)
		}
	}
}
