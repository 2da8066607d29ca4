package podrunner

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// sigKill is what a crash, or the chaos API, sends.
const sigKill = syscall.SIGKILL

// process is one running replica process.
type process struct {
	cmd     *exec.Cmd
	done    chan struct{} // closed once reaped
	waitErr error         // set before done is closed
}

// startProcess starts argv with exactly env, output appended to logPath. The
// process gets its own process group, so that signals reach anything it forks,
// and dies with the runner even if the runner is killed.
func startProcess(argv, env []string, dir, logPath string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process group, unless the process is already reaped
// (its pid may then belong to someone else).
func (p *process) signal(sig syscall.Signal) {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.pid(), sig)
	_ = syscall.Kill(p.pid(), sig)
}

// terminate is the kubelet's stop: SIGTERM, then SIGKILL after the grace
// period. It returns once the process is reaped.
func (p *process) terminate(grace time.Duration) {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.signal(syscall.SIGKILL)
	<-p.done
}

// exitReason describes how the process ended, as kubectl would.
func (p *process) exitReason() string {
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by " + ws.Signal().String()
		}
		return "exit code " + strconv.Itoa(ee.ExitCode())
	}
	if p.waitErr != nil {
		return p.waitErr.Error()
	}
	return "exit code 0"
}

// commandLine maps a container's command and args onto the binary that stands
// in for the image: the image's entrypoint (e.g. /flashsale) is the binary.
// Anything else the image might hold cannot be run here.
func commandLine(binary, entrypoint string, c *corev1.Container, env []corev1.EnvVar) ([]string, error) {
	lookup := envLookup(env)
	argv := []string{binary}
	if len(c.Command) > 0 {
		if c.Command[0] != entrypoint && path.Base(c.Command[0]) != path.Base(entrypoint) {
			return nil, fmt.Errorf("command %q: only the image's entrypoint %s can run here", c.Command[0], entrypoint)
		}
		for _, a := range c.Command[1:] {
			argv = append(argv, expand(a, lookup))
		}
	}
	for _, a := range c.Args {
		argv = append(argv, expand(a, lookup))
	}
	return argv, nil
}

func envLookup(env []corev1.EnvVar) func(string) (string, bool) {
	return func(name string) (string, bool) {
		// Later entries win, as in the process environment.
		for i := len(env) - 1; i >= 0; i-- {
			if env[i].Name == name {
				return env[i].Value, true
			}
		}
		return "", false
	}
}

// environ renders the base environment (what the image sets) followed by the
// container's; for duplicate names the last one wins.
func environ(base []string, env []corev1.EnvVar) []string {
	out := slices.Clone(base)
	for _, e := range env {
		out = append(out, e.Name+"="+e.Value)
	}
	seen := map[string]bool{}
	var dedup []string
	for i := len(out) - 1; i >= 0; i-- {
		name, _, _ := strings.Cut(out[i], "=")
		if seen[name] {
			continue
		}
		seen[name] = true
		dedup = append(dedup, out[i])
	}
	slices.Reverse(dedup)
	return dedup
}

// setEnv sets name in env, replacing an existing entry in place.
func setEnv(env []corev1.EnvVar, name, value string) []corev1.EnvVar {
	for i := range env {
		if env[i].Name == name {
			env[i].Value = value
			return env
		}
	}
	return append(env, corev1.EnvVar{Name: name, Value: value})
}

// portQuarantine is how long a port handed to one replica is not handed to
// another: longer than a process takes to bind it.
const portQuarantine = time.Minute

// handedOut holds the ports freePort returned within portQuarantine.
var handedOut struct {
	sync.Mutex
	at map[int]time.Time
}

// freePort returns a port that is free on 127.0.0.1 now and that no replica
// of this process was given within portQuarantine: the kernel may give a port
// just closed to the next bind, and two replicas started together would then
// be handed the same one. Another process may still take it before the
// replica binds it; the replica then exits and is restarted on another port.
func freePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	now := time.Now()
	for p, t := range handedOut.at {
		if now.Sub(t) > portQuarantine {
			delete(handedOut.at, p)
		}
	}
	if handedOut.at == nil {
		handedOut.at = map[int]time.Time{}
	}
	for range 100 {
		l, err := net.Listen("tcp", net.JoinHostPort(podIP, "0"))
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if _, taken := handedOut.at[port]; !taken {
			handedOut.at[port] = now
			return port, nil
		}
	}
	return 0, errors.New("no free port on " + podIP + " that was not just handed out")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
