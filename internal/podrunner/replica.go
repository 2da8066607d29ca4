package podrunner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Phases of a replica, as reported by Pods.
const (
	PhasePending     = "Pending"     // not started yet
	PhaseRunning     = "Running"     // the process is running
	PhaseWaiting     = "Waiting"     // crashed or could not start; restarting after a backoff
	PhaseTerminating = "Terminating" // SIGTERM sent, waiting for the process to exit
	PhaseStopped     = "Stopped"     // gone for good
)

// resolveTimeout bounds reading a replica's Secrets and ConfigMaps.
const resolveTimeout = 10 * time.Second

// replica is one "pod" of a Deployment: a process of the binary, restarted when
// it exits, until it is stopped.
type replica struct {
	r          *Runner
	namespace  string
	deployment string
	slot       int
	name       string
	uid        string
	hash       string
	template   *corev1.PodTemplateSpec
	grace      time.Duration
	logPath    string
	dir        string

	stopOnce sync.Once
	stopCh   chan struct{} // closed to stop the replica
	done     chan struct{} // closed once the process is gone for good

	mu         sync.Mutex
	proc       *process
	port       int
	ports      map[int32]int // container port -> where this process listens
	phase      string
	ready      bool
	readySince time.Time
	starts     int
	lastExit   string
	lastError  string
}

func (rp *replica) container() *corev1.Container { return &rp.template.Spec.Containers[0] }

// stop asks the replica to terminate; it returns at once.
func (rp *replica) stop() {
	rp.stopOnce.Do(func() { close(rp.stopCh) })
}

func (rp *replica) stopping() bool {
	select {
	case <-rp.stopCh:
		return true
	default:
		return false
	}
}

// run is the replica's life: start, watch, restart with backoff, until stopped.
func (rp *replica) run(ctx context.Context) {
	defer close(rp.done)
	defer rp.r.kick()
	cfg := rp.r.cfg
	backoff := cfg.BackoffInitial
	for {
		if rp.stopping() {
			rp.set(func() { rp.phase = PhaseStopped })
			return
		}
		proc, ports, err := rp.start(ctx)
		if err != nil {
			rp.set(func() { rp.phase, rp.lastError = PhaseWaiting, err.Error() })
			rp.r.log.Warn("replica cannot start", "pod", rp.namespace+"/"+rp.name, "err", err, "retryIn", backoff)
			rp.r.kick()
			if !rp.wait(backoff) {
				rp.set(func() { rp.phase = PhaseStopped })
				return
			}
			backoff = min(2*backoff, cfg.BackoffMax)
			continue
		}
		started := time.Now()
		pctx, cancelProbes := context.WithCancel(ctx)
		go rp.probe(pctx, proc, ports)
		select {
		case <-proc.done:
			cancelProbes()
			reason := proc.exitReason()
			rp.set(func() {
				rp.proc, rp.ready, rp.phase, rp.lastExit = nil, false, PhaseWaiting, reason
			})
			rp.r.log.Warn("replica exited", "pod", rp.namespace+"/"+rp.name, "pid", proc.pid(), "reason", reason, "restartIn", backoff)
			rp.r.kick()
			if time.Since(started) >= cfg.BackoffReset {
				backoff = cfg.BackoffInitial
			}
			if !rp.wait(backoff) {
				rp.set(func() { rp.phase = PhaseStopped })
				return
			}
			backoff = min(2*backoff, cfg.BackoffMax)
		case <-rp.stopCh:
			cancelProbes()
			rp.set(func() { rp.ready, rp.phase = false, PhaseTerminating })
			rp.r.kick()
			proc.terminate(rp.grace)
			reason := proc.exitReason()
			rp.set(func() { rp.proc, rp.phase, rp.lastExit = nil, PhaseStopped, reason })
			rp.r.log.Info("replica stopped", "pod", rp.namespace+"/"+rp.name, "pid", proc.pid(), "reason", reason)
			return
		}
	}
}

// wait sleeps for a backoff unless the replica is stopped first.
func (rp *replica) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-rp.stopCh:
		return false
	case <-t.C:
		return true
	}
}

func (rp *replica) set(f func()) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	f()
}

// listenPort is the port the container listens on according to its spec: the
// port of the listen address in its environment, else its first declared port.
func listenPort(c *corev1.Container, listenEnv string) int32 {
	for _, e := range c.Env {
		if e.Name == listenEnv && e.ValueFrom == nil {
			if n := addrPort(e.Value); n > 0 {
				return n
			}
		}
	}
	if len(c.Ports) > 0 {
		return c.Ports[0].ContainerPort
	}
	return 0
}

// addrPort is the port of a listen address (":9090"), or 0.
func addrPort(addr string) int32 {
	if _, p, err := net.SplitHostPort(addr); err == nil {
		if n, err := strconv.ParseUint(p, 10, 16); err == nil {
			return int32(n)
		}
	}
	return 0
}

// start resolves the environment and starts one process of the replica.
// The ports it returns map each container port the process listens on (its
// listen address's and its aside addresses') to where it really listens.
func (rp *replica) start(ctx context.Context) (*process, map[int32]int, error) {
	cfg := rp.r.cfg
	c := rp.container()
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	env, err := rp.r.resolver.containerEnv(rctx, c, rp.meta())
	cancel()
	if err != nil {
		return nil, nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	// The one deviation from the pod spec: replicas share the host's network
	// namespace, so each listens on its own loopback port instead of the
	// container port.
	env = setEnv(env, cfg.ListenEnv, net.JoinHostPort(podIP, strconv.Itoa(port)))
	ports := map[int32]int{listenPort(c, cfg.ListenEnv): port}
	var aside []string
	for _, name := range cfg.AsideListenEnvs {
		if i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == name && e.Value != "" }); i >= 0 {
			p, err := freePort()
			if err != nil {
				return nil, nil, err
			}
			if cp := addrPort(env[i].Value); cp > 0 {
				ports[cp] = p // a probe or Service may name this port
			}
			env[i].Value = net.JoinHostPort(podIP, strconv.Itoa(p))
			aside = append(aside, name+"="+env[i].Value)
		}
	}
	argv, err := commandLine(cfg.Binary, cfg.Entrypoint, c, env)
	if err != nil {
		return nil, nil, err
	}
	base := append(append([]string(nil), cfg.Env...), "HOSTNAME="+rp.name)
	full := environ(base, env)
	if err := os.MkdirAll(rp.dir, 0o755); err != nil {
		return nil, nil, err
	}
	rp.mu.Lock()
	n := rp.starts + 1
	rp.mu.Unlock()
	header := fmt.Sprintf("==> %s podrunner: start #%d of %s/%s on %s:%d%s: %s\n",
		time.Now().UTC().Format(time.RFC3339Nano), n, rp.namespace, rp.name, podIP, port,
		strings.Join(append([]string{""}, aside...), " "), strings.Join(argv[1:], " "))
	if err := appendFile(rp.logPath, header); err != nil {
		return nil, nil, err
	}
	proc, err := startProcess(argv, full, rp.dir, rp.logPath)
	if err != nil {
		return nil, nil, err
	}
	rp.set(func() {
		rp.proc, rp.port, rp.ports, rp.phase, rp.starts, rp.lastError = proc, port, ports, PhaseRunning, n, ""
		rp.ready = false
	})
	rp.r.log.Info("replica started", "pod", rp.namespace+"/"+rp.name, "pid", proc.pid(), "port", port, "start", n)
	rp.r.kick()
	return proc, ports, nil
}

// probe runs the readiness and liveness probes of one process. Without a
// readiness probe a running process is ready, as in Kubernetes.
func (rp *replica) probe(ctx context.Context, proc *process, ports map[int32]int) {
	c := rp.container()
	t := probeTarget{container: c, ports: ports}
	if c.LivenessProbe != nil {
		go t.probeLoop(ctx, c.LivenessProbe, true, false, func(ok bool, err error) {
			if ok {
				return
			}
			rp.r.log.Warn("liveness probe failed: restarting", "pod", rp.namespace+"/"+rp.name, "err", err)
			rp.set(func() { rp.lastError = "liveness probe failed: " + err.Error() })
			go proc.terminate(rp.grace)
		})
	}
	if c.ReadinessProbe == nil {
		rp.setReady(proc, true, nil)
		return
	}
	t.probeLoop(ctx, c.ReadinessProbe, false, true, func(ok bool, err error) {
		rp.setReady(proc, ok, err)
	})
}

func (rp *replica) setReady(proc *process, ok bool, err error) {
	rp.mu.Lock()
	if rp.proc != proc || proc.exited() { // a late result about an earlier process
		rp.mu.Unlock()
		return
	}
	rp.ready = ok
	if ok {
		rp.readySince = time.Now()
	} else if err != nil {
		rp.lastError = "readiness probe failed: " + err.Error()
	}
	rp.mu.Unlock()
	rp.r.kick()
}

func (rp *replica) meta() podMeta {
	return podMeta{
		Namespace: rp.namespace, Name: rp.name, UID: rp.uid,
		Labels: rp.template.Labels, Annotations: rp.template.Annotations,
		ServiceAccount: rp.template.Spec.ServiceAccountName,
	}
}

// snapshot is the replica's state at one moment.
type snapshot struct {
	phase      string
	pid, port  int
	ports      map[int32]int
	ready      bool
	readySince time.Time
	restarts   int
	lastExit   string
	lastError  string
}

func (rp *replica) snapshot() snapshot {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	s := snapshot{
		phase: rp.phase, port: rp.port, ports: rp.ports, ready: rp.ready, readySince: rp.readySince,
		restarts: max(rp.starts-1, 0), lastExit: rp.lastExit, lastError: rp.lastError,
	}
	if rp.proc != nil {
		s.pid = rp.proc.pid()
	}
	if rp.phase != PhaseRunning {
		s.ready = false
	}
	return s
}

// endpoint is where the replica serves targetPort, if it is ready to.
func (rp *replica) endpoint(targetPort intstr.IntOrString) (string, bool) {
	s := rp.snapshot()
	if !s.ready || rp.stopping() {
		return "", false
	}
	t := probeTarget{container: rp.container(), ports: s.ports}
	port, err := t.port(targetPort)
	if err != nil {
		return "", false
	}
	return net.JoinHostPort(podIP, strconv.Itoa(port)), true
}

func appendFile(path, s string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	return errors.Join(err, f.Close())
}
