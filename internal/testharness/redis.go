package testharness

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Redis is a redis-server process on 127.0.0.1 with its own data directory.
// Persistence is off (no RDB snapshots, no AOF), but "dir" points at the data
// directory so that an explicit SAVE writes dump.rdb there and the next Start
// loads it.
type Redis struct {
	mu      sync.Mutex
	bin     string
	dir     string // holds redis.log and data/
	dataDir string
	logPath string
	port    int
	busPort int // > 0 for a cluster node
	extra   []string
	p       *proc // nil while not running
	closed  bool
}

// StartRedis starts a standalone redis-server on a free 127.0.0.1 port.
func StartRedis() (*Redis, error) { return StartRedisArgs() }

// StartRedisArgs is StartRedis with extra redis-server arguments appended to
// the command line, e.g. "--appendonly", "yes".
func StartRedisArgs(args ...string) (*Redis, error) {
	r, err := newRedis(false, args)
	if err != nil {
		return nil, err
	}
	register(r)
	return r, nil
}

// RedisT starts a standalone Redis for a test and closes it in t.Cleanup.
func RedisT(t testing.TB) *Redis {
	t.Helper()
	r, err := StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func newRedis(cluster bool, extra []string) (*Redis, error) {
	bin, err := lookBinary("redis-server", "redis-server")
	if err != nil {
		return nil, err
	}
	dir, err := tempDir("redis")
	if err != nil {
		return nil, err
	}
	r := &Redis{bin: bin, dir: dir, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "redis.log"), extra: extra}
	if err := os.Mkdir(r.dataDir, 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for range startAttempts {
		_ = os.Remove(r.logPath) // portInUse must only see this attempt
		if err = wipeDir(r.dataDir); err != nil {
			break
		}
		if r.port, err = pickPort(); err != nil {
			break
		}
		if cluster {
			if r.busPort, err = pickPort(); err != nil {
				break
			}
		}
		if err = r.start(); err == nil || !portInUse(r.logPath) {
			break
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return r, nil
}

// Addr returns "127.0.0.1:PORT".
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Port returns the TCP port.
func (r *Redis) Port() int { return r.port }

// PID is the redis-server process id, 0 while it is not running.
func (r *Redis) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil {
		return 0
	}
	return r.p.pid()
}

// LogPath returns the server's log file (kept across restarts).
func (r *Redis) LogPath() string { return r.logPath }

// Start starts the server again on the same port with whatever its data
// directory holds. It is an error if the server is running.
func (r *Redis) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("redis: closed")
	}
	return r.start()
}

func (r *Redis) start() error {
	if r.p != nil {
		return fmt.Errorf("redis %s already running", r.Addr())
	}
	args := []string{
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--protected-mode", "yes",
		"--dir", r.dataDir, "--save", "", "--appendonly", "no", "--daemonize", "no",
		"--enable-debug-command", "local",
	}
	if r.busPort > 0 {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(r.busPort), "--cluster-node-timeout", "5000")
	}
	p, err := startProc(r.logPath, r.dir, nil, nil, r.bin, append(args, r.extra...)...)
	if err != nil {
		return err
	}
	err = waitReady(p, "redis-server "+r.Addr(), func() error {
		pong, err := redisCmdTimeout(r.Addr(), time.Second, "PING")
		if err == nil && pong != "PONG" {
			err = fmt.Errorf("PING answered %q", pong)
		}
		if err != nil {
			return err
		}
		// The port may have been taken by another server before ours bound it.
		info, err := redisCmdTimeout(r.Addr(), time.Second, "INFO", "server")
		if err == nil && !strings.Contains(info, fmt.Sprintf("\r\nprocess_id:%d\r\n", p.pid())) {
			err = fmt.Errorf("%s is served by another process", r.Addr())
		}
		return err
	})
	if err != nil {
		_ = p.kill()
		return err
	}
	r.p = p
	return nil
}

// Kill sends SIGKILL to the server and waits for it to exit. Killing a server
// that is not running does nothing.
func (r *Redis) Kill() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kill()
}

func (r *Redis) kill() error {
	if r.p == nil {
		return nil
	}
	err := r.p.kill()
	r.p = nil
	return err
}

// RestartEmpty kills the server, deletes its data and starts it again: a Redis
// that lost everything, with a new run_id.
func (r *Redis) RestartEmpty() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.kill(); err != nil {
		return err
	}
	if err := wipeDir(r.dataDir); err != nil {
		return err
	}
	return r.start()
}

// RestartWithData saves an RDB snapshot, kills the server and starts it again:
// the data survives, the script cache and client connections do not.
func (r *Redis) RestartWithData() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := redisCmd(r.Addr(), "SAVE"); err != nil {
		return err
	}
	if err := r.kill(); err != nil {
		return err
	}
	return r.start()
}

// Close kills the server and removes its directory. It is idempotent.
func (r *Redis) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	unregister(r)
	return errors.Join(r.kill(), os.RemoveAll(r.dir))
}

// wipeDir removes everything inside dir, keeping dir itself.
func wipeDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// redisCmd sends one command over a fresh connection and returns a simple,
// integer or bulk string reply. Error replies become errors.
func redisCmd(addr string, args ...string) (string, error) {
	return redisCmdTimeout(addr, readyTimeout, args...)
}

func redisCmdTimeout(addr string, timeout time.Duration, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	rd := bufio.NewReader(conn)
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch {
	case line == "":
	case line[0] == '+' || line[0] == ':':
		return line[1:], nil
	case line[0] == '-':
		return "", fmt.Errorf("redis %s: %s", args[0], line[1:])
	case line[0] == '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("redis %s: unexpected reply %q", args[0], line)
}
