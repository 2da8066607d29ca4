package localenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is a long-running flashsale process this package started (the
// manager, the pod runner). It is stopped by its pid, never by name.
type Process struct {
	Name string
	Log  string // its stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed
}

// startProcess runs bin with args, output to logPath, in its own process
// group, killed if this process dies first.
func startProcess(name, logPath string, env []string, bin string, args ...string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited tells whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM and waits up to grace for the process to exit, then
// SIGKILLs it and its process group.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = syscall.Kill(p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	_ = syscall.Kill(p.PID(), syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("%s (pid %d) did not stop within %v of SIGTERM; killed", p.Name, p.PID(), grace)
}

// exitError describes an unexpected exit, with the end of the log.
func (p *Process) exitError() error {
	return fmt.Errorf("%s (pid %d) exited: %v\n%s", p.Name, p.PID(), p.err, LogTail(p.Log, 30))
}

// LogTail returns the last n lines of a log file, for error messages.
func LogTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "--- tail of " + path + " ---\n" + strings.Join(lines, "\n")
}

// childEnv is this process's environment for a child, without anything that
// would make it think it runs inside a cluster.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KUBERNETES_SERVICE_") || strings.HasPrefix(kv, "KUBECONFIG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}
