// Package localenv starts a whole flash-sale environment on one machine, under
// one working directory: a Kubernetes API server and etcd with the CRDs from
// config/crd/bases, Redis, PostgreSQL, the operator (`flashsale manager`) and
// the local pod runner (internal/podrunner/podrunner, built on its own), run
// as processes; or, with Options.Node, a real node (internal/testharness.Cluster)
// with the operator deployed as a pod of its image. `make demo` and the end-to-end tests use it; it drives the
// environment the way a person would, with kubectl.
//
// The servers come from internal/testharness. Their directories, like
// everything else, go under Options.Dir: Start points TMPDIR there for the
// calling process.
package localenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/flashsale-dev/flashsale-operator/internal/podrunner"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// Defaults for Options' zero values.
const (
	DefaultStatusRefresh  = time.Second
	DefaultMaxGrace       = 10 * time.Second
	DefaultRestartBackoff = 500 * time.Millisecond
	// DefaultImage is the image the operator puts in its pod specs. The pod
	// runner runs the local binary instead, so it is only a label here.
	DefaultImage = "flashsale-operator:local"
)

// Database names of the ledger Start creates.
const (
	DatabaseName     = "flashsale"
	DatabaseUser     = "flashsale"
	DatabasePassword = "flashsale"
)

// startTimeout bounds waiting for the manager and the pod runner to come up.
const startTimeout = 60 * time.Second

// Options configure Start.
type Options struct {
	// Dir is the working directory (required); created if needed.
	Dir string
	// Binary is the built flashsale binary (required).
	Binary string
	// StatusRefresh is the manager's --status-refresh.
	StatusRefresh time.Duration
	// MaxGrace is the pod runner's --max-grace.
	MaxGrace time.Duration
	// RestartBackoff is the pod runner's --restart-backoff.
	RestartBackoff time.Duration
	// Image is the manager's --image.
	Image string
	// Progress, if set, is told about each step once it is done.
	Progress func(step string, took time.Duration)
	// Node runs everything on a real node (internal/testharness.Cluster):
	// the operator as a Deployment of its image, its pods under the kubelet,
	// Services through kube-proxy. Binary is then ignored: the binary built
	// for the image is used (Env.Binary).
	Node bool
}

// Env is a running environment. Close stops it.
type Env struct {
	Dir        string
	Binary     string
	Kubeconfig string
	KubectlBin string // the kubectl built with the envtest binaries
	Kube       *testharness.Kube
	Redis      *testharness.Redis
	Postgres   *testharness.Postgres
	DSN        string // the ledger database, as DatabaseUser
	Manager    *Process
	Runner     *Process
	RunnerAPI  *podrunner.Client
	RunnerDir  string
	// On a real node: the cluster, and the ledger's DSN as pods reach it
	// (DSN is this machine's, for the tests' own queries).
	Cluster *testharness.Cluster
	PodDSN  string

	podRedis     string
	imageArchive string

	opts       Options
	extras     []*testharness.Redis
	extraPGs   []*testharness.Postgres
	outsideTmp string // TMPDIR when Dir is below a private directory
}

// setDefaults fills the options left zero with their defaults.
func (o *Options) setDefaults() {
	if o.StatusRefresh <= 0 {
		o.StatusRefresh = DefaultStatusRefresh
	}
	if o.MaxGrace <= 0 {
		o.MaxGrace = DefaultMaxGrace
	}
	if o.RestartBackoff <= 0 {
		o.RestartBackoff = DefaultRestartBackoff
	}
	if o.Image == "" {
		o.Image = DefaultImage
	}
}

// Start brings the environment up. On error, everything started is stopped.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	if opts.Dir == "" || (opts.Binary == "" && !opts.Node) {
		return nil, errors.New("localenv: Dir and Binary are required")
	}
	opts.setDefaults()
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	bin := ""
	if !opts.Node {
		if bin, err = filepath.Abs(opts.Binary); err != nil {
			return nil, err
		}
	}
	e := &Env{Dir: dir, Binary: bin, opts: opts, RunnerDir: filepath.Join(dir, "podrunner")}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Close())
		}
	}()
	// PostgreSQL runs as an unprivileged user under root: it must be able to
	// reach its directory below this one.
	for _, d := range []string{dir, filepath.Join(dir, "tmp"), filepath.Join(dir, "logs"), e.RunnerDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, err
		}
	}
	tmp := filepath.Join(dir, "tmp")
	if os.Geteuid() == 0 && !traversable(dir) {
		// Below a private directory such as /root, PostgreSQL's user could
		// not reach its data: that goes below the system's temporary
		// directory instead, removed by Close, or by a later run's sweep
		// when this process was killed (the name carries its pid).
		if tmp, err = testharness.RunDir("localenv"); err != nil {
			return nil, err
		}
		e.outsideTmp = tmp
		if err := os.Chmod(tmp, 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.Setenv("TMPDIR", tmp); err != nil {
		return nil, err
	}

	// envtest logs through controller-runtime; the servers' own logs are in
	// their directories, so its messages go nowhere.
	ctrllog.SetLogger(logr.Discard())

	step := func(name string, f func() error) error {
		start := time.Now()
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if opts.Progress != nil {
			opts.Progress(name, time.Since(start))
		}
		return nil
	}
	if opts.Node {
		if err := e.startNode(ctx, step); err != nil {
			return nil, err
		}
		return e, nil
	}
	if err := step("Kubernetes API server + etcd, CRDs from config/crd/bases", func() error {
		k, err := testharness.StartKube()
		if err != nil {
			return err
		}
		e.Kube = k
		if e.Kubeconfig, err = k.Kubeconfig(dir); err != nil {
			return err
		}
		assets, err := testharness.KubeAssets()
		if err != nil {
			return err
		}
		e.KubectlBin = filepath.Join(assets, "kubectl")
		return nil
	}); err != nil {
		return nil, err
	}
	if err := e.startServers(ctx, step); err != nil {
		return nil, err
	}
	if err := step("operator (flashsale manager)", e.startManager); err != nil {
		return nil, err
	}
	if err := step("local pod runner (internal/podrunner/podrunner)", e.startRunner); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Env) logPath(name string) string { return filepath.Join(e.Dir, "logs", name+".log") }

func (e *Env) startManager() error {
	metrics, err := testharness.FreePort()
	if err != nil {
		return err
	}
	probes, err := testharness.FreePort()
	if err != nil {
		return err
	}
	p, err := startProcess("flashsale manager", e.logPath("manager"), childEnv(), e.Binary, "manager",
		"--kubeconfig", e.Kubeconfig,
		"--leader-elect=false",
		"--metrics-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(metrics)),
		"--health-probe-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(probes)),
		"--status-refresh", e.opts.StatusRefresh.String(),
		"--image", e.opts.Image,
	)
	if err != nil {
		return err
	}
	e.Manager = p
	readyz := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(probes)) + "/readyz"
	return waitFor(p, startTimeout, func() error {
		resp, err := http.Get(readyz)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s answered %d", readyz, resp.StatusCode)
		}
		return nil
	})
}

func (e *Env) startRunner() error {
	state := filepath.Join(e.RunnerDir, "state.json")
	runner := filepath.Join(e.Dir, "podrunner-bin")
	build := exec.Command("go", "build", "-o", runner, "./internal/podrunner/podrunner")
	build.Dir = testharness.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./internal/podrunner/podrunner: %w\n%s", err, out)
	}
	p, err := startProcess("podrunner", e.logPath("podrunner"), childEnv(), runner,
		"--kubeconfig", e.Kubeconfig,
		"--binary", e.Binary,
		"--dir", e.RunnerDir,
		"--state-file", state,
		"--admin-listen", "127.0.0.1:0",
		"--max-grace", e.opts.MaxGrace.String(),
		"--restart-backoff", e.opts.RestartBackoff.String(),
	)
	if err != nil {
		return err
	}
	e.Runner = p
	return waitFor(p, startTimeout, func() error {
		st, err := podrunner.ReadState(state)
		if err != nil {
			return err
		}
		if st.Admin == "" {
			return errors.New("no admin endpoint in the state file yet")
		}
		e.RunnerAPI = &podrunner.Client{URL: st.Admin}
		_, err = e.RunnerAPI.State(context.Background())
		return err
	})
}

// waitFor polls check until it succeeds, p exits or the timeout passes.
func waitFor(p *Process, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		if p.Exited() {
			return p.exitError()
		}
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %v\n%s", p.Name, timeout, err, LogTail(p.Log, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close stops everything Start started, each process by its pid: the pod runner
// first (it stops the replicas), then the manager, then the servers. Logs stay
// in Dir/logs.
func (e *Env) Close() error {
	var errs []error
	if e.Runner != nil {
		errs = append(errs, e.Runner.Stop(e.opts.MaxGrace+10*time.Second))
	}
	if e.Manager != nil {
		errs = append(errs, e.Manager.Stop(10*time.Second))
	}
	if e.Cluster != nil {
		errs = append(errs, e.Cluster.Stop())
	} else if e.Kube != nil {
		errs = append(errs, e.Kube.Stop())
	}
	for _, r := range append([]*testharness.Redis{e.Redis}, e.extras...) {
		if r != nil {
			errs = append(errs, r.Close())
		}
	}
	for _, pg := range append([]*testharness.Postgres{e.Postgres}, e.extraPGs...) {
		if pg != nil {
			errs = append(errs, pg.Close())
		}
	}
	if e.outsideTmp != "" {
		errs = append(errs, os.RemoveAll(e.outsideTmp))
	}
	return errors.Join(errs...)
}

// traversable reports whether every user may pass through each parent of dir.
func traversable(dir string) bool {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if p == filepath.Dir(p) {
			return true
		}
	}
}

// KubectlEnv is the environment kubectl runs with: this environment's KUBECONFIG.
func (e *Env) KubectlEnv() []string { return childEnv("KUBECONFIG=" + e.Kubeconfig) }

// Kubectl runs kubectl with stdin (may be nil) and returns its stdout; an
// error carries stderr.
func (e *Env) Kubectl(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, e.KubectlBin, args...)
	cmd.Env = e.KubectlEnv()
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// SecretValues are the values this environment puts into the sample Secrets in
// place of their placeholders: secret name → key → value.
func (e *Env) SecretValues() map[string]map[string]string {
	if e.Cluster != nil {
		return map[string]map[string]string{
			"shop-redis":  {"addresses": e.podRedis},
			"shop-ledger": {"dsn": e.PodDSN},
		}
	}
	return map[string]map[string]string{
		"shop-redis":  {"addresses": e.Redis.Addr()},
		"shop-ledger": {"dsn": e.DSN},
	}
}

// RenderSecret reads a Secret manifest and replaces the stringData values named
// in values (other fields stay as they are). changed lists the keys replaced.
func RenderSecret(path string, values map[string]map[string]string) (manifest []byte, changed []string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var obj map[string]any
	if err := yaml.Unmarshal(b, &obj); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if kind, _ := obj["kind"].(string); kind != "Secret" {
		return nil, nil, fmt.Errorf("%s is a %q, not a Secret", path, kind)
	}
	meta, _ := obj["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	repl, ok := values[name]
	if !ok {
		return b, nil, nil
	}
	data, _ := obj["stringData"].(map[string]any)
	if data == nil {
		data = map[string]any{}
		obj["stringData"] = data
	}
	for _, k := range slices.Sorted(maps.Keys(repl)) {
		data[k] = repl[k]
		changed = append(changed, k)
	}
	out, err := yaml.Marshal(obj)
	return out, changed, err
}

// ServiceURL waits until the pod runner exposes the Service and returns its URL.
func (e *Env) ServiceURL(ctx context.Context, namespace, name string) (string, error) {
	if e.Cluster != nil {
		return e.serviceURLOnNode(ctx, namespace, name)
	}
	for {
		st, err := e.RunnerAPI.State(ctx)
		if err == nil {
			if u, ok := st.ServiceURL(namespace, name, 0); ok {
				return u, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("service %s/%s not exposed by the pod runner: %w", namespace, name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
