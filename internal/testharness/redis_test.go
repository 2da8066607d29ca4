package testharness

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func newRedisClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func runID(t *testing.T, addr string) string {
	t.Helper()
	info, err := redisCmd(addr, "INFO", "server")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if id, ok := strings.CutPrefix(line, "run_id:"); ok {
			return id
		}
	}
	t.Fatalf("no run_id in INFO server:\n%s", info)
	return ""
}

func TestRedisConfigAndKill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := RedisT(t)
	if !strings.HasPrefix(r.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr() = %q, want 127.0.0.1:PORT", r.Addr())
	}
	c := newRedisClient(t, r.Addr())
	for param, want := range map[string]string{"bind": "127.0.0.1", "save": "", "appendonly": "no", "dir": r.dataDir} {
		got, err := c.ConfigGet(ctx, param).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got[param] != want {
			t.Errorf("CONFIG GET %s = %q, want %q", param, got[param], want)
		}
	}
	if info, err := c.Info(ctx, "server").Result(); err != nil || !strings.Contains(info, fmt.Sprintf("process_id:%d\r\n", r.PID())) {
		t.Errorf("PID() = %d, not the process_id of INFO server (%v)", r.PID(), err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET k = %q, %v; want v", got, err)
	}

	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded after Kill")
	}
	if conn, err := net.DialTimeout("tcp", r.Addr(), time.Second); err == nil {
		conn.Close()
		t.Fatal("port still accepts connections after Kill")
	}
	if err := r.Kill(); err != nil {
		t.Fatalf("second Kill: %v", err)
	}
	if pid := r.PID(); pid != 0 {
		t.Errorf("PID() = %d after Kill, want 0", pid)
	}

	// Start after Kill without a SAVE: same port, no data.
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err == nil {
		t.Fatal("Start of a running server succeeded")
	}
	if err := c.Get(ctx, "k").Err(); err != redis.Nil {
		t.Fatalf("GET k after Kill+Start: %v, want redis.Nil", err)
	}
}

func TestRedisRestartEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := RedisT(t)
	c := newRedisClient(t, r.Addr())
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// A saved snapshot must not survive either.
	if err := c.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := runID(t, r.Addr())
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, "k").Err(); err != redis.Nil {
		t.Fatalf("GET k after RestartEmpty: %v, want redis.Nil", err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after RestartEmpty = %d, %v; want 0", n, err)
	}
	if after := runID(t, r.Addr()); after == before {
		t.Fatalf("run_id unchanged after RestartEmpty: %s", after)
	}
}

func TestRedisRestartWithData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := RedisT(t)
	c := newRedisClient(t, r.Addr())
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	sha, err := c.ScriptLoad(ctx, "return redis.call('GET', KEYS[1])").Result()
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.ScriptExists(ctx, sha).Result(); err != nil || !ok[0] {
		t.Fatalf("SCRIPT EXISTS before restart = %v, %v; want true", ok, err)
	}
	before := runID(t, r.Addr())

	if err := r.RestartWithData(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET k after RestartWithData = %q, %v; want v", got, err)
	}
	if ok, err := c.ScriptExists(ctx, sha).Result(); err != nil || ok[0] {
		t.Fatalf("SCRIPT EXISTS after restart = %v, %v; want false", ok, err)
	}
	if err := c.EvalSha(ctx, sha, []string{"k"}).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
		t.Fatalf("EVALSHA after restart: %v, want NOSCRIPT", err)
	}
	if after := runID(t, r.Addr()); after == before {
		t.Fatalf("run_id unchanged after RestartWithData: %s", after)
	}
}

func TestRedisCloseIdempotent(t *testing.T) {
	t.Parallel()
	r, err := StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(r.dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s still there after Close: %v", r.dir, err)
	}
	if conn, err := net.DialTimeout("tcp", r.Addr(), time.Second); err == nil {
		conn.Close()
		t.Fatal("port still accepts connections after Close")
	}
	if err := r.Start(); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}

// Not parallel: it changes PATH for the whole process.
func TestMissingBinaryNamesInstallCommand(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := StartRedis()
	if err == nil {
		t.Fatal("StartRedis succeeded without redis-server on PATH")
	}
	want := "redis-server not found: run hack/install-deps.sh (apt-get install redis-server)"
	if err.Error() != want {
		t.Fatalf("error = %q, want %q", err, want)
	}
	if _, err := StartRedisCluster(); err == nil || !strings.Contains(err.Error(), "apt-get install redis-tools") {
		t.Fatalf("StartRedisCluster error = %v, want it to name redis-tools", err)
	}
}

func TestFreePort(t *testing.T) {
	t.Parallel()
	seen := map[int]bool{}
	for range 20 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("FreePort returned %d twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			// FreePort bound it a moment before; a process outside the
			// harness's locks may have taken it since. That says nothing of
			// FreePort, unless the holder is this process: then FreePort gave
			// out a port this process already holds.
			holder := portHolder(p)
			if holder == "" || strings.Contains(holder, "pid="+strconv.Itoa(os.Getpid())+",") {
				t.Fatalf("port %d from FreePort is not bindable: %v (held by %q)", p, err, holder)
			}
			t.Logf("port %d from FreePort was taken since by another process: %s", p, holder)
			continue
		}
		l.Close()
	}
}

// portHolder is ss's lines for the TCP sockets bound to port, in any state,
// or "". Not listeners only: a connection still open on a port whose listener
// closed (one that did not set SO_REUSEADDR) also refuses the bind.
func portHolder(port int) string {
	out, err := exec.Command("ss", "-Htanp", fmt.Sprintf("sport = :%d", port)).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// Ports come from below the ephemeral range, each held by a lock that no
// other process (nor another open of the file) can take while this one runs.
func TestFreePortIsReserved(t *testing.T) {
	t.Parallel()
	low, high := reservedRange()
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if high <= low {
		return // an ephemeral range that leaves none below it: any free port (TestFreePort)
	}
	if p < low || p > high {
		t.Fatalf("port %d outside %d-%d", p, low, high)
	}
	dir, err := portLockDir()
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := lockPort(dir, p); ok {
		f.Close()
		t.Fatalf("port %d's lock was free", p)
	}
}

// Not parallel: it replaces pickPort for the whole package.
func TestStartRetriesWhenPortTaken(t *testing.T) {
	ctx := context.Background()
	var takenPort, calls int
	pickPort = func() (int, error) {
		calls++
		if calls == 1 && takenPort != 0 {
			return takenPort, nil
		}
		return FreePort()
	}
	defer func() { pickPort = FreePort }()

	// A port held by another Redis: the new one must not mistake it for itself.
	r1 := RedisT(t)
	takenPort, calls = r1.Port(), 0
	r2 := RedisT(t)
	if r2.Port() == takenPort || calls != 2 {
		t.Fatalf("redis on port %d after %d picks; want a retry away from %d", r2.Port(), calls, takenPort)
	}
	if err := newRedisClient(t, r2.Addr()).Set(ctx, "only-in-r2", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := newRedisClient(t, r1.Addr()).Exists(ctx, "only-in-r2").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS on the first redis = %d, %v; want 0", n, err)
	}

	// A port held by a listener that never answers.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort, calls = taken.Addr().(*net.TCPAddr).Port, 0
	pg := PostgresT(t)
	if pg.Port() == takenPort || calls != 2 {
		t.Fatalf("postgres on port %d after %d picks; want a retry away from %d", pg.Port(), calls, takenPort)
	}
}
