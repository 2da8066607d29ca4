package testharness

import (
	"context"
	"os"
	"testing"
	"time"
)

// A standby is in recovery, replays what the primary commits, and Close
// leaves none of its processes or files; a replication client's Close ends
// its process.
func TestPostgresStandby(t *testing.T) {
	t.Parallel()
	pg := PostgresT(t)
	sb, err := pg.StartStandby("pg-b")
	if err != nil {
		t.Fatal(err)
	}
	primary, standby := pgConnect(t, pg.AdminDSN()), pgConnect(t, sb.AdminDSN())
	pgExec(t, primary, "CREATE TABLE replayed (v int); INSERT INTO replayed VALUES (7)")
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var inRecovery bool
	if err := standby.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("standby in recovery: %v, %v", inRecovery, err)
	}
	for {
		var v int
		if err := standby.QueryRow(ctx, "SELECT v FROM replayed").Scan(&v); err == nil && v == 7 {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("the primary's row never reached the standby: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = standby.Close(ctx)
	procs := pgProcesses(t, sb)
	if len(procs) == 0 {
		t.Fatal("no standby process found")
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range procs {
		if live, _ := procState(pid); live {
			t.Fatalf("standby process %d left after Close", pid)
		}
	}
	if _, err := os.Stat(sb.dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s still there after Close: %v", sb.dir, err)
	}

	backup, err := pg.SlowBaseBackup()
	if err != nil {
		t.Fatal(err)
	}
	pid := backup.p.pid()
	if err := backup.Close(); err != nil {
		t.Fatal(err)
	}
	if live, _ := procState(pid); live {
		t.Fatalf("pg_basebackup %d still runs after Close", pid)
	}
	if err := backup.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// A standby with a slot streams from it; stopped, it leaves the slot idle
// on the primary, and started again it streams from it once more.
func TestPostgresStandbyWithSlot(t *testing.T) {
	t.Parallel()
	pg := PostgresT(t)
	sb, err := pg.StartStandbyWithSlot("pg-b", "pg_b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close() })
	primary := pgConnect(t, pg.AdminDSN())
	slotActive := func(want bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		for {
			var active bool
			err := primary.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'pg_b' AND slot_type = 'physical'").Scan(&active)
			if err == nil && active == want {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("slot pg_b active %v, %v; want active %v", active, err, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	slotActive(true)
	if err := sb.Stop(); err != nil {
		t.Fatal(err)
	}
	slotActive(false)
	if err := sb.Start(); err != nil {
		t.Fatal(err)
	}
	slotActive(true)
}
