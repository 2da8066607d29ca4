package testharness

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func pgConnect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func pgExec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func pgNames(t *testing.T, dsn string) string {
	t.Helper()
	conn := pgConnect(t, dsn)
	rows, err := conn.Query(context.Background(), "SELECT name FROM items ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, ",")
}

func pgUnreachable(t *testing.T, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, dsn); err == nil {
		conn.Close(ctx)
		t.Fatal("connected to a stopped server")
	}
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := PostgresT(t)

	admin := pgConnect(t, pg.AdminDSN())
	for setting, want := range map[string]string{"listen_addresses": "127.0.0.1", "fsync": "off", "max_connections": "300", "port": strconv.Itoa(pg.Port())} {
		var got string
		if err := admin.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	var backend int
	if err := admin.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cpustat.Children(pg.PID()), backend) {
		t.Errorf("backend %d is not a child of PID() %d", backend, pg.PID())
	}
	if os.Geteuid() == 0 {
		if uid := procUID(t, pg.p.pid()); uid == "0" {
			t.Fatal("postmaster runs as root")
		}
	}

	dsn1, err := pg.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	dsn2, err := pg.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	if dsn1 == dsn2 {
		t.Fatalf("NewDatabase returned %s twice", dsn1)
	}
	db1, db2 := pgConnect(t, dsn1), pgConnect(t, dsn2)
	pgExec(t, db1, "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)")
	pgExec(t, db1, "INSERT INTO items VALUES (1, 'committed')")
	var pgErr *pgconn.PgError
	if _, err := db2.Exec(ctx, "SELECT 1 FROM items"); !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("table of the first database visible in the second: %v", err)
	}
	pgExec(t, db2, "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)")
	pgExec(t, db2, "INSERT INTO items VALUES (7, 'other')")
	if got := pgNames(t, dsn1); got != "committed" {
		t.Fatalf("first database holds %q, want committed", got)
	}

	if pids := pgProcesses(t, pg); len(pids) < 3 {
		t.Fatalf("found only postgres processes %v; the liveness check below would prove nothing", pids)
	}

	// An open transaction at crash time is lost, the committed row is not.
	tx, err := db1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO items VALUES (2, 'uncommitted')"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Kill(); err != nil {
		t.Fatal(err)
	}
	if pids := pgProcesses(t, pg); len(pids) > 0 {
		t.Fatalf("postgres processes %v still alive after Kill", pids)
	}
	pgUnreachable(t, dsn1)
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	if got := pgNames(t, dsn1); got != "committed" {
		t.Fatalf("after Kill+Start the first database holds %q, want committed", got)
	}
	if got := pgNames(t, dsn2); got != "other" {
		t.Fatalf("after Kill+Start the second database holds %q, want other", got)
	}

	pgExec(t, pgConnect(t, dsn1), "INSERT INTO items VALUES (3, 'before stop')")
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	pgUnreachable(t, dsn1)
	if err := pg.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	if got := pgNames(t, dsn1); got != "committed,before stop" {
		t.Fatalf("after Stop+Start the first database holds %q", got)
	}
	if _, err := pg.NewDatabase(); err != nil {
		t.Fatalf("NewDatabase after restart: %v", err)
	}
}

func TestPostgresCloseIdempotent(t *testing.T) {
	t.Parallel()
	pg, err := StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(pg.dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s still there after Close: %v", pg.dir, err)
	}
	pgUnreachable(t, pg.AdminDSN())
}

// pgProcesses lists the live processes working in the data directory: the
// postmaster and every backend.
func pgProcesses(t *testing.T, pg *Postgres) []int {
	t.Helper()
	dataDir, err := filepath.EvalSymlinks(pg.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			if live, _ := procState(pid); live && procCwd(pid) == dataDir {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// procUID returns the real uid of a process.
func procUID(t *testing.T, pid int) string {
	t.Helper()
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Fields(rest)[0]
		}
	}
	t.Fatal("no Uid in /proc status")
	return ""
}
