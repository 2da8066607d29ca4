package testharness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgSuperuser is the superuser initdb creates; loopback connections use trust
// authentication, so it needs no password.
const pgSuperuser = "postgres"

// Postgres is a PostgreSQL server on 127.0.0.1 with its own data directory
// and its unix socket in its temporary directory. PostgreSQL refuses to run
// as root, so under root it runs as the "postgres" user or, failing that,
// "nobody".
type Postgres struct {
	mu      sync.Mutex
	binDir  string
	dir     string // holds data/, the unix socket and postgres.log
	dataDir string
	logPath string
	port    int
	cred    *syscall.Credential // nil: run as the current user
	p       *proc               // nil while not running
	closed  bool
	dbSeq   int
	extra   []string // "name=value" settings given to StartPostgresArgs
}

// EnvPostgresLocale names the locale initdb gives the test servers, e.g.
// en_US.UTF-8 (it must be installed: locale -a), to price what a ledger
// database with a libc collation costs; unset: no locale (C).
const EnvPostgresLocale = "FLASHSALE_TEST_PG_LOCALE"

// StartPostgres runs initdb in a new temporary directory and starts postgres
// on a free 127.0.0.1 port.
func StartPostgres() (*Postgres, error) { return StartPostgresArgs() }

// StartPostgresArgs is StartPostgres with extra "name=value" settings that
// override the defaults, e.g. "fsync=on" for benchmarks that must pay for
// durability as production does.
func StartPostgresArgs(settings ...string) (*Postgres, error) {
	binDir, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := pgCredential()
	if err != nil {
		return nil, err
	}
	dir, err := tempDir("pg")
	if err != nil {
		return nil, err
	}
	pg := &Postgres{binDir: binDir, dir: dir, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "postgres.log"), cred: cred, extra: settings}
	if err := pg.initdb(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := pg.startOnFreePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	register(pg)
	return pg, nil
}

// startOnFreePort starts the server on a free port, on another one when the
// port was taken between the pick and the server's bind.
func (pg *Postgres) startOnFreePort() (err error) {
	for range startAttempts {
		_ = os.Remove(pg.logPath) // portInUse must only see this attempt
		if pg.port, err = pickPort(); err != nil {
			return err
		}
		if err = pg.start(); err == nil || !portInUse(pg.logPath) {
			return err
		}
	}
	return err
}

// PostgresT starts PostgreSQL for a test and closes it in t.Cleanup.
func PostgresT(t testing.TB) *Postgres {
	t.Helper()
	pg, err := StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Close() })
	return pg
}

func (pg *Postgres) initdb() error {
	if pg.cred != nil {
		if err := reachable(pg.dir, pg.cred.Uid); err != nil {
			return err
		}
		if err := os.Chown(pg.dir, int(pg.cred.Uid), int(pg.cred.Gid)); err != nil {
			return err
		}
	}
	logPath := filepath.Join(pg.dir, "initdb.log")
	locale := []string{"--no-locale"}
	if l := os.Getenv(EnvPostgresLocale); l != "" {
		locale = []string{"--locale=" + l}
	}
	p, err := startProc(logPath, pg.dir, pg.cred, []string{"TZ=UTC", "LC_ALL=C"}, filepath.Join(pg.binDir, "initdb"),
		append([]string{"-D", pg.dataDir, "-U", pgSuperuser, "-A", "trust", "-E", "UTF8", "--no-sync"}, locale...)...)
	if err != nil {
		return err
	}
	<-p.done
	if p.waitErr != nil {
		return fmt.Errorf("initdb: %v\n%s", p.waitErr, logTail(logPath))
	}
	return nil
}

// Port returns the TCP port.
func (pg *Postgres) Port() int { return pg.port }

// PID is the postmaster's process id (its backends are its children), 0
// while it is not running.
func (pg *Postgres) PID() int {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.p == nil {
		return 0
	}
	return pg.p.pid()
}

// LogPath returns the server's log file (kept across restarts).
func (pg *Postgres) LogPath() string { return pg.logPath }

// DSN returns a pgx connection string for database db as the superuser.
func (pg *Postgres) DSN(db string) string {
	host := net.JoinHostPort("127.0.0.1", strconv.Itoa(pg.port))
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgSuperuser, host, db)
}

// AdminDSN returns the DSN of the "postgres" database as the superuser.
func (pg *Postgres) AdminDSN() string { return pg.DSN("postgres") }

// SetReadOnly makes the server refuse writes in every session, open ones
// too, as a primary demoted in a switchover does
// (default_transaction_read_only, reloaded), or take them again; it returns
// once a new session sees the setting.
func (pg *Postgres) SetReadOnly(on bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.AdminDSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	set, want := "ALTER SYSTEM RESET default_transaction_read_only", "off"
	if on {
		set, want = "ALTER SYSTEM SET default_transaction_read_only = on", "on"
	}
	for _, q := range []string{set, "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	// The reload is signalled: a session sees it before its next query, but
	// only once the postmaster has passed it on.
	for {
		c, err := pgx.Connect(ctx, pg.AdminDSN())
		if err != nil {
			return err
		}
		var v string
		err = c.QueryRow(ctx, "SHOW default_transaction_read_only").Scan(&v)
		_ = c.Close(context.Background())
		switch {
		case err != nil:
			return err
		case v == want:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("default_transaction_read_only still %s: %w", v, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// NewDatabase creates a database with a name unique to this server and
// returns its DSN.
func (pg *Postgres) NewDatabase() (string, error) {
	pg.mu.Lock()
	pg.dbSeq++
	name := fmt.Sprintf("test_%d", pg.dbSeq)
	pg.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.AdminDSN())
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return pg.DSN(name), nil
}

// Start starts the server again on the same port and data directory (after a
// Kill this includes crash recovery) and waits until it accepts connections.
func (pg *Postgres) Start() error {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.closed {
		return errors.New("postgres: closed")
	}
	return pg.start()
}

func (pg *Postgres) start() error {
	if pg.p != nil {
		return fmt.Errorf("postgres on port %d already running", pg.port)
	}
	args := []string{"-D", pg.dataDir, "-p", strconv.Itoa(pg.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + pg.dir,
		"-c", "fsync=off", // committed data survives a process kill, not a machine crash
		"-c", "max_connections=300",
		"-c", "shared_buffers=32MB",
		"-c", "dynamic_shared_memory_type=mmap", // files in the data dir, not /dev/shm
		"-c", "logging_collector=off"}
	for _, s := range pg.extra {
		args = append(args, "-c", s) // later settings win
	}
	p, err := startProc(pg.logPath, pg.dir, pg.cred, []string{"LC_ALL=C"}, filepath.Join(pg.binDir, "postgres"), args...)
	if err != nil {
		return err
	}
	// Backends leave the process group (setsid) but work in the data directory.
	if p.workDir, err = filepath.EvalSymlinks(pg.dataDir); err != nil {
		p.workDir = pg.dataDir
	}
	err = waitReady(p, fmt.Sprintf("postgres on port %d", pg.port), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pg.AdminDSN())
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		// The port may have been taken by another server before ours bound it.
		var dataDir string
		if err := conn.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dataDir); err != nil {
			return err
		}
		if dataDir != pg.dataDir {
			return fmt.Errorf("port %d is served by another postgres (data directory %s)", pg.port, dataDir)
		}
		return nil
	})
	if err != nil {
		_ = p.kill()
		return err
	}
	pg.p = p
	return nil
}

// Stop shuts the server down with a fast shutdown (SIGINT) and waits for it.
func (pg *Postgres) Stop() error {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	return pg.stop()
}

func (pg *Postgres) stop() error {
	if pg.p == nil {
		return nil
	}
	err := pg.p.stop(syscall.SIGINT, readyTimeout)
	pg.p = nil
	return err
}

// Kill sends SIGKILL to the postmaster and its process group, as a crash
// would, and waits until none of its processes is left.
func (pg *Postgres) Kill() error {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.p == nil {
		return nil
	}
	err := pg.p.kill()
	pg.p = nil
	return err
}

// Close stops the server and removes its directory. It is idempotent.
func (pg *Postgres) Close() error {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.closed {
		return nil
	}
	pg.closed = true
	unregister(pg)
	return errors.Join(pg.stop(), os.RemoveAll(pg.dir))
}

// pgBinDir finds the directory holding initdb and postgres: pg_config's
// bindir, else the newest /usr/lib/postgresql/*/bin, else $PATH.
func pgBinDir() (string, error) {
	var dirs []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	major := func(d string) int { n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d))); return n }
	slices.SortFunc(versions, func(a, b string) int { return major(b) - major(a) })
	dirs = append(dirs, versions...)
	if initdb, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(initdb))
	}
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", missing("initdb and postgres", "postgresql")
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// pgCredential returns nil when not root, else the unprivileged user to run
// PostgreSQL as.
func pgCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 == nil && err2 == nil && uid != 0 {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
		}
	}
	return nil, errors.New(`running as root and neither user "postgres" nor "nobody" exists: PostgreSQL refuses to run as root (create one with useradd)`)
}

// reachable checks that uid can traverse every parent of dir.
func reachable(dir string, uid uint32) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm()&0o001 == 0 && (!ok || st.Uid != uid) {
			return fmt.Errorf("%s is not accessible to uid %d, which runs PostgreSQL: set TMPDIR to a world-accessible directory such as /tmp", p, uid)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// WaitForLockWaiters waits up to timeout until at least n sessions of the
// database dsn names wait for a lock. It asks on a connection of its own: a
// transaction sees pg_stat_activity as it was at its first read.
func WaitForLockWaiters(t testing.TB, dsn string, n int, timeout time.Duration, what string) {
	t.Helper()
	ctx := context.Background()
	watcher, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(ctx)
	Eventually(t, timeout, what, func() bool {
		var got int
		err := watcher.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()").Scan(&got)
		return err == nil && got >= n
	})
}
