// Package testharness starts real Redis (standalone and Cluster) and PostgreSQL
// servers for tests, on free 127.0.0.1 ports, each in its own temporary
// directory, and lets tests crash and restart them.
//
// The servers come from the Debian packages installed by hack/install-deps.sh;
// a missing binary is an error naming the package, never a skipped test.
// Every server is registered so that TestMain can call CloseAll on exit, and
// every process gets Setpgid and a parent-death signal so it dies with the
// test binary even when cleanup code never runs.
package testharness

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// readyTimeout bounds how long a server may take to accept connections.
const readyTimeout = 30 * time.Second

// startAttempts is how many ports a first start tries when the port was taken
// between FreePort and the server's bind.
const startAttempts = 4

// proc is one running server process.
type proc struct {
	cmd     *exec.Cmd
	logPath string
	workDir string        // if set, processes working there belong to the server
	done    chan struct{} // closed once the process has been reaped
	waitErr error         // set before done is closed
}

// startProc starts name with args, stdout and stderr appended to logPath. A
// non-nil cred runs the process as that user.
func startProc(logPath, dir string, cred *syscall.Credential, env []string, name string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child keeps its own copy
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
		Credential: cred,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL to the process and its process group, reaps it and waits
// until none of its processes is left alive (zombies left to an init that
// never reaps them do not count: they hold no port and no memory).
func (p *proc) kill() error {
	pid := p.pid()
	if !p.exited() { // a reaped pid may already belong to someone else
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	select {
	case <-p.done:
	case <-time.After(readyTimeout):
		return fmt.Errorf("pid %d did not exit after SIGKILL", pid)
	}
	return p.waitFamilyGone(readyTimeout)
}

// stop sends sig and waits up to timeout for the process to exit, then kills it.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) error {
	_ = syscall.Kill(p.pid(), sig)
	select {
	case <-p.done:
		return p.waitFamilyGone(timeout)
	case <-time.After(timeout):
		return errors.Join(fmt.Errorf("pid %d ignored %v for %v; killed", p.pid(), sig, timeout), p.kill())
	}
}

// waitFamilyGone SIGKILLs, until none is left, every live process that is in
// the process group of the (exited) server or works in its workDir. The
// second test catches PostgreSQL backends, which call setsid() and so leave
// the postmaster's group, but chdir to the data directory.
func (p *proc) waitFamilyGone(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		found := 0
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return err
		}
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			live, pgrp := procState(pid)
			if !live {
				continue
			}
			if pgrp == p.pid() || p.workDir != "" && procCwd(pid) == p.workDir {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				found++
			}
		}
		if found == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes of pid %d still alive after %v", found, p.pid(), timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procState reads /proc/PID/stat: whether the process exists and is not a
// zombie, and its process group.
func procState(pid int) (live bool, pgrp int) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false, 0
	}
	// pid (comm) state ppid pgrp ...; comm may contain spaces and parens.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 3 {
		return false, 0
	}
	pgrp, _ = strconv.Atoi(f[2])
	return f[0] != "Z" && f[0] != "X", pgrp
}

func procCwd(pid int) string {
	cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	return cwd
}

// waitReady polls check until it succeeds, the process exits or readyTimeout
// passes. Errors carry the tail of the server's log.
func waitReady(p *proc, what string, check func() error) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		if p.exited() { // checked first: after an exit, the port may be someone else's
			return fmt.Errorf("%s exited before accepting connections (%v)\n%s", what, p.waitErr, logTail(p.logPath))
		}
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %v\n%s", what, readyTimeout, err, logTail(p.logPath))
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// logTail returns the last lines of a log file, for error messages.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return "--- tail of " + path + " ---\n" + strings.Join(lines, "\n")
}

// portInUse tells from a server log whether the last start failed to bind.
func portInUse(logPath string) bool {
	b, _ := os.ReadFile(logPath)
	return bytes.Contains(b, []byte("already in use"))
}

// lookBinary finds a server binary or says which package installs it.
func lookBinary(name, pkg string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return "", missing(name, pkg)
	}
	return path, nil
}

func missing(name, pkg string) error {
	return fmt.Errorf("%s not found: run hack/install-deps.sh (apt-get install %s)", name, pkg)
}

// pickPort chooses the port of a first start; tests replace it.
var pickPort = FreePort

var ports struct {
	sync.Mutex
	given map[int]bool
	locks []*os.File // held until the process exits: the ports stay ours
}

// Ports come from below the kernel's ephemeral range, which bind(0) and every
// outgoing connection draw from: a server restarted on its port cannot find it
// taken by some client's connection, and test binaries running at once (go
// test runs packages in parallel) share the range through lock files, each
// port held by one process for its lifetime.
const (
	portRangeLow  = 20000
	portRangeHigh = 32767 // below Linux's default ephemeral range (32768-60999)
)

// FreePort returns a TCP port that is free on 127.0.0.1 and reserved for this
// process: no other process using this package gets it while this one runs,
// and the kernel does not hand it out to connections. It never returns the
// same port twice within one process.
func FreePort() (int, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.given == nil {
		ports.given = map[int]bool{}
	}
	low, high := reservedRange()
	if high > low {
		dir, err := portLockDir()
		if err == nil {
			for range 200 {
				port := low + rand.IntN(high-low+1)
				if ports.given[port] {
					continue
				}
				if lock, ok := lockPort(dir, port); ok {
					if bindable(port) {
						ports.given[port] = true
						ports.locks = append(ports.locks, lock)
						return port, nil
					}
					_ = lock.Close()
				}
			}
		}
	}
	// No reserved range here (an unusual ephemeral range, no lock directory):
	// any free port, which another process may still take before it is bound.
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !ports.given[port] {
			ports.given[port] = true
			return port, nil
		}
	}
	return 0, errors.New("no free port on 127.0.0.1")
}

// reservedRange is [portRangeLow, portRangeHigh] cut below the ephemeral range.
func reservedRange() (int, int) {
	high := portRangeHigh
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil {
				high = min(high, lo-1)
			}
		}
	}
	return portRangeLow, high
}

// portLockDir is shared by every process and user of the machine (sticky,
// like /tmp). It does not follow $TMPDIR, which a process may change (the
// local environment points it at its own directory) or set per user.
func portLockDir() (string, error) {
	base := "/tmp"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "flashsale-testharness-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return "", err
	}
	_ = os.Chmod(dir, 0o777|os.ModeSticky) // umask; fails harmlessly when another user made it
	return dir, nil
}

// lockPort takes the port's lock file; the lock ends with the file or the
// process.
func lockPort(dir string, port int) (*os.File, bool) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, false
	}
	_ = f.Chmod(0o666) // another user may take it after this process
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, false
	}
	return f, true
}

func bindable(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

const tempPrefix = "testharness-"

var sweepOnce sync.Once

// tempDir makes a private directory for one server. Its name carries this
// process's pid so that directories left behind by a test binary that was
// killed are removed by the next one.
func tempDir(kind string) (string, error) {
	sweepOnce.Do(sweepStale)
	return os.MkdirTemp("", fmt.Sprintf("%s%d-%s-", tempPrefix, os.Getpid(), kind))
}

func sweepStale() {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, m := range matches {
		rest := strings.TrimPrefix(filepath.Base(m), tempPrefix)
		pid, err := strconv.Atoi(rest[:max(strings.IndexByte(rest, '-'), 0)])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if live, _ := procState(pid); !live {
			_ = os.RemoveAll(m)
		}
	}
}

type closer interface{ Close() error }

var registry struct {
	sync.Mutex
	open map[closer]bool
}

func register(c closer) {
	registry.Lock()
	defer registry.Unlock()
	if registry.open == nil {
		registry.open = map[closer]bool{}
	}
	registry.open[c] = true
}

func unregister(c closer) {
	registry.Lock()
	defer registry.Unlock()
	delete(registry.open, c)
}

// CloseAll closes every server started by this package that is still open.
// Call it from TestMain after m.Run so that no server outlives the tests.
func CloseAll() error {
	registry.Lock()
	open := make([]closer, 0, len(registry.open))
	for c := range registry.open {
		open = append(open, c)
	}
	registry.Unlock()
	errs := make([]error, 0, len(open))
	for _, c := range open {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
