package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

func numCPU() int       { return runtime.NumCPU() }
func goVersion() string { return runtime.Version() }

// buildTimeout bounds one go build.
const buildTimeout = 5 * time.Minute

// flashsaleBinary returns the flashsale binary to exec: the one given, or
// bin/flashsale, rebuilt like `make build` does when it is missing or older
// than a source file (a stale binary would measure old code).
func flashsaleBinary(ctx context.Context, root, given string) (string, error) {
	if given != "" {
		return given, nil
	}
	bin := repoPath(root, "bin", "flashsale")
	fi, err := os.Stat(bin)
	if err == nil {
		newest, src, err := newestSource(root)
		if err != nil {
			return "", err
		}
		if !newest.After(fi.ModTime()) {
			return bin, nil
		}
		logf("bin/flashsale is older than %s: rebuilding", src)
	} else {
		logf("bin/flashsale missing: building")
	}
	err = goBuild(ctx, root, bin, "./cmd/flashsale")
	return bin, err
}

// buildBare builds the bare reference handler into the run's directory.
func buildBare(ctx context.Context, root, work string) (string, error) {
	out := filepath.Join(work, "bare")
	return out, goBuild(ctx, root, out, "./hack/bench/bare")
}

// goBuild builds with the flags of `make build`, less the version stamps.
func goBuild(ctx context.Context, root, out, pkg string) error {
	return goBuildWith(ctx, root, out, pkg, "-s -w")
}

func goBuildWith(ctx context.Context, root, out, pkg, ldflags string) error {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, stderr.String())
	}
	return nil
}

// newestSource is the newest file that goes into bin/flashsale (Go sources,
// embedded scripts and migrations, the module files, the PGO profile).
func newestSource(root string) (time.Time, string, error) {
	var newest time.Time
	var which string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "hack", "docs", "config", "test", "testdata":
				if path != root {
					return filepath.SkipDir
				}
			}
			return nil
		}
		name := d.Name()
		if strings.HasSuffix(name, "_test.go") {
			return nil
		}
		switch filepath.Ext(name) {
		case ".go", ".lua", ".sql", ".pgo":
		default:
			if name != "go.mod" && name != "go.sum" {
				return nil
			}
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.ModTime().After(newest) {
			newest, which = fi.ModTime(), strings.TrimPrefix(path, root+"/")
		}
		return nil
	})
	return newest, which, err
}

// server is a process this run started: a reserve process or the bare handler.
type server struct {
	name    string
	cmd     *exec.Cmd
	addr    string
	logPath string
	done    chan struct{}
	waitErr error
}

// readyTimeout bounds a server's start.
const readyTimeout = 60 * time.Second

// startServer execs bin with args and env on a free loopback port, which it
// gets as FLASHSALE_LISTEN and, when listenFlag is set, as that flag too,
// and waits until GET /readyz answers 200.
func startServer(ctx context.Context, name, logDir, bin string, args []string, listenFlag string, env []string) (*server, error) {
	port, err := testharness.FreePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if listenFlag != "" {
		args = append(args, listenFlag+"="+addr)
	}
	logPath := filepath.Join(logDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), env...), config.EnvListen+"="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A server must not outlive a bench that was killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{name: name, cmd: cmd, addr: addr, logPath: logPath, done: make(chan struct{})}
	go func() { s.waitErr = cmd.Wait(); close(s.done) }()

	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-s.done:
			return nil, fmt.Errorf("%s exited before it was ready: %v\n%s", name, s.waitErr, tail(logPath))
		case <-ctx.Done():
			_ = s.stop() // the start failed; its exit status adds nothing
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := client.Get("http://" + addr + config.PathReadyz)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			_ = s.stop() // the start failed; its exit status adds nothing
			return nil, fmt.Errorf("%s not ready on %s after %s (last: %v)\n%s", name, addr, readyTimeout, err, tail(logPath))
		}
	}
}

func (s *server) url() string { return "http://" + s.addr }

func (s *server) pid() int { return s.cmd.Process.Pid }

// stopTimeout is how long a server gets to drain after SIGTERM before SIGKILL.
const stopTimeout = 30 * time.Second

// stop sends SIGTERM to this process (by its pid, nothing else) and waits;
// SIGKILL after stopTimeout.
func (s *server) stop() error {
	select {
	case <-s.done:
		return s.exitErr()
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		return s.exitErr()
	case <-time.After(stopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.done
		return fmt.Errorf("%s did not stop within %s of SIGTERM: killed", s.name, stopTimeout)
	}
}

func (s *server) exitErr() error {
	var ee *exec.ExitError
	if errors.As(s.waitErr, &ee) {
		return fmt.Errorf("%s: %v\n%s", s.name, s.waitErr, tail(s.logPath))
	}
	return s.waitErr
}

// cpuTime is the user+system CPU the process has used so far.
func (s *server) cpuTime() time.Duration { return cpustat.Process(s.pid()) }

// peakRSS is the most resident memory the process has held since it started,
// in bytes (0 when unreadable). It counts the binary's file pages, which a
// pod's cgroup may reclaim, and not the kernel's memory for the process
// (socket buffers), which the cgroup charges: a guide to a pod's limit, not
// its measure.
func (s *server) peakRSS() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid()))
	if err != nil {
		return 0
	}
	return procKB(string(b), "VmHWM")
}

// procKB reads a "key:  1234 kB" line of a /proc file (status, meminfo), in
// bytes; 0 when absent or not so.
func procKB(text, key string) int64 {
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(line, key+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return 0
		}
		return kb << 10
	}
	return 0
}

// othersCores is how many cores, on average over elapsed, processes other
// than ours kept busy: the noise in a row's figures.
func othersCores(busy, ours, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return max(0, (busy-ours).Seconds()/elapsed.Seconds())
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	const n = 3000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
