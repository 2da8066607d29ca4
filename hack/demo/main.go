// Command demo is `make demo`: a whole flash sale on one machine. It installs
// what is missing, builds what is not cached, starts a real one-node
// Kubernetes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// containerd, the kubelet and kube-proxy, in a network namespace of their
// own), Redis and PostgreSQL, deploys the operator from config/default as a
// pod of its image, applies the samples from config/samples with kubectl,
// shows the pods the operator made and their logs, storms the sale through
// its Service with `flashsale storm`, prints `kubectl get flashsales` and the
// audit, and tears everything down again; with --keep it stays up until
// Ctrl-C so that a person can poke at it. --node=false runs the operator and
// the local pod runner as processes instead (no root needed).
//
//	go run ./hack/demo [--keep] [--dir .demo] [--buyers 10000] [--node=false]
package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// The sample the demo runs, as config/samples has it.
const (
	namespace     = "shop"
	saleName      = "ps5-drop"
	saleManifest  = "config/samples/flashsale_v1alpha1_flashsale.yaml"
	readyTimeout  = 2 * time.Minute
	stormTimeout  = 5 * time.Minute
	statusTimeout = 30 * time.Second
)

// secretManifests are the sample Secrets; the Redis and ledger ones get this
// machine's addresses in place of their placeholders.
var secretManifests = []string{
	"config/samples/secret_shop-redis.yaml",
	"config/samples/secret_shop-ledger.yaml",
	"config/samples/secret_waiting-room.yaml",
}

type options struct {
	node   bool
	keep   bool
	dir    string
	buyers int
}

func main() {
	var o options
	flag.BoolVar(&o.node, "node", true, "run on a real node (kubelet, containerd, kube-proxy; needs root); false: the local pod runner")
	flag.BoolVar(&o.keep, "keep", false, "keep everything running after the storm, until Ctrl-C")
	flag.StringVar(&o.dir, "dir", ".demo", "working directory: new, empty, or an earlier demo's (wiped at start; the pod runner's logs stay there afterwards, and a failed run's logs are copied to the test-logs archive)")
	flag.IntVar(&o.buyers, "buyers", 10000, "buyers in the storm")
	flag.Parse()

	// A closed terminal (SIGHUP) tears down too: a node's containers run
	// under containerd's shims, which outlive the demo's own children.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo failed: %v\n", err)
		os.Exit(1)
	}
}

// out prints the demo's progress: each step with how long it took.
type out struct {
	start time.Time
	w     io.Writer
}

func (p *out) done(step string, took time.Duration) {
	fmt.Fprintf(p.w, "  ✓ %-60s %6.1fs\n", step, took.Seconds())
}

func (p *out) section(title string) {
	fmt.Fprintf(p.w, "\n==> %s  [%s]\n", title, time.Since(p.start).Round(100*time.Millisecond))
}

func (p *out) command(args ...string) {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = shellQuote(a)
	}
	fmt.Fprintf(p.w, "  $ %s\n", strings.Join(quoted, " "))
}

// shellQuote quotes an argument for a POSIX shell when it needs it, so that a
// printed command can be pasted.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=/.,:@<>+%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// timed runs f and reports it as a step.
func (p *out) timed(step string, f func() error) error {
	start := time.Now()
	if err := f(); err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	p.done(step, time.Since(start))
	return nil
}

// run is the demo's steps in the order it prints them, so it reads top to
// bottom rather than splitting into functions for the complexity count.
//
//nolint:gocyclo // one linear script of checked steps
func run(ctx context.Context, o options) (err error) {
	root := testharness.RepoRoot()
	if err := os.Chdir(root); err != nil {
		return err
	}
	p := &out{start: time.Now(), w: os.Stdout}
	dir, err := prepareDir(o.dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(p.w, "flashsale demo: a whole flash sale on this machine (working directory %s)\n", dir)

	p.section("Build")
	if err := p.timed("Debian packages (hack/install-deps.sh)", func() error {
		return runQuiet(ctx, "bash", "hack/install-deps.sh")
	}); err != nil {
		return err
	}
	if o.node {
		// Before the builds: a node needs root, and its build is the longest.
		if err := testharness.NodeSupported(); err != nil {
			return fmt.Errorf("%w (run as root, or --node=false for the local pod runner)", err)
		}
	}
	if err := p.timed("envtest binaries (hack/build-envtest.sh, cached)", func() error {
		return runQuiet(ctx, "bash", "hack/build-envtest.sh")
	}); err != nil {
		return err
	}
	bin := filepath.Join(root, "bin", "flashsale")
	if o.node {
		if err := p.timed("node binaries (hack/build-kube-node.sh, cached)", func() error {
			return runQuiet(ctx, "bash", "hack/build-kube-node.sh")
		}); err != nil {
			return err
		}
	} else if err := p.timed("bin/flashsale (go build -o bin/flashsale ./cmd/flashsale)", func() error {
		return runQuiet(ctx, "go", "build", "-o", bin, "./cmd/flashsale")
	}); err != nil {
		return err
	}

	p.section("Start a local cluster")
	env, err := localenv.Start(ctx, localenv.Options{Dir: dir, Binary: bin, Node: o.node, Progress: p.done})
	if env != nil {
		defer func() {
			p.section("Tear down")
			if err != nil {
				// Stopping a node removes its directory, its components' and
				// pods' logs with it: a failed run's are copied first.
				if kept, kerr := testharness.KeepLogs("demo", dir); kerr == nil {
					fmt.Fprintf(p.w, "  the failed run's logs: %s\n", kept)
				}
			}
			start := time.Now()
			cerr := env.Close()
			if cerr == nil && env.Cluster != nil {
				p.done("stopped the pods, the node, the control plane, Redis and PostgreSQL; no mount, namespace or rule left", time.Since(start))
			} else if cerr == nil {
				p.done(fmt.Sprintf("stopped the pod runner (pid %d), the manager (pid %d), the API server, Redis and PostgreSQL",
					env.Runner.PID(), env.Manager.PID()), time.Since(start))
				fmt.Fprintf(p.w, "  logs: %s\n", filepath.Join(dir, "logs"))
			}
			err = errors.Join(err, cerr)
		}()
	}
	if err != nil {
		return err
	}
	if env.Cluster != nil {
		bin = env.Binary
		fmt.Fprintf(p.w, "  node %s at %s (network namespace %s), API server %s\n", testharness.NodeName, env.Cluster.NodeIP, filepath.Base(env.Cluster.Netns), env.Kube.Config.Host)
		fmt.Fprintf(p.w, "  Redis %s and PostgreSQL 127.0.0.1:%d on this machine, reached by the pods at %s\n", env.Redis.Addr(), env.Postgres.Port(), env.Cluster.NodeIP)
		if err := printKubectl(ctx, p, env, "get", "nodes,pods", "-A", "-o", "wide"); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(p.w, "  API server %s, Redis %s, PostgreSQL 127.0.0.1:%d\n", env.Kube.Config.Host, env.Redis.Addr(), env.Postgres.Port())
		fmt.Fprintf(p.w, "  manager pid %d, pod runner pid %d; logs in %s\n", env.Manager.PID(), env.Runner.PID(), filepath.Join(dir, "logs"))
	}

	p.section("Apply the samples from config/samples with kubectl")
	kubectl := func(stdin []byte, args ...string) (string, error) {
		p.command(append([]string{"kubectl"}, args...)...)
		return env.Kubectl(ctx, stdin, args...)
	}
	if _, err := kubectl(nil, "create", "namespace", namespace); err != nil {
		return err
	}
	values := env.SecretValues()
	for _, m := range secretManifests {
		rendered, changed, err := localenv.RenderSecret(m, values)
		if err != nil {
			return err
		}
		if len(changed) == 0 {
			if _, err := kubectl(nil, "apply", "-n", namespace, "-f", m); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(p.w, "  # %s with this machine's %s\n", m, strings.Join(changed, ", "))
		if _, err := kubectl(rendered, "apply", "-n", namespace, "-f", "-"); err != nil {
			return err
		}
	}
	if _, err := kubectl(nil, "apply", "-n", namespace, "-f", saleManifest); err != nil {
		return err
	}
	start := time.Now()
	if _, err := kubectl(nil, "wait", "-n", namespace, "--for=condition=Ready", "flashsale/"+saleName,
		"--timeout="+readyTimeout.String()); err != nil {
		if env.Cluster != nil {
			logs, _ := env.Kubectl(ctx, nil, "logs", "-n", localenv.ManagerNamespace, "deployment/flashsale-controller-manager", "--tail=20")
			return fmt.Errorf("%w\n%s", err, logs)
		}
		return fmt.Errorf("%w\n%s\n%s", err, localenv.LogTail(env.Manager.Log, 20), localenv.LogTail(env.Runner.Log, 20))
	}
	p.done("FlashSale "+saleName+" is Ready: stock seeded, reserve API up", time.Since(start))
	start = time.Now()
	for _, d := range []string{saleName + "-reserve", saleName + "-sweeper"} {
		if _, err := kubectl(nil, "rollout", "status", "-n", namespace, "deployment/"+d, "--timeout="+readyTimeout.String()); err != nil {
			return err
		}
	}
	if env.Cluster != nil {
		p.done("every pod Running and Ready under the kubelet", time.Since(start))
	} else {
		p.done("every replica ready, as the pod runner reports it", time.Since(start))
	}
	if err := printKubectl(ctx, p, env, "get", "flashsales,deployments,services", "-n", namespace); err != nil {
		return err
	}
	if env.Cluster != nil {
		if err := printKubectl(ctx, p, env, "get", "pods", "-n", namespace, "-o", "wide"); err != nil {
			return err
		}
		if err := printKubectl(ctx, p, env, "logs", "-n", namespace, "deployment/"+saleName+"-reserve", "--tail=3"); err != nil {
			return err
		}
	}

	alloc, err := env.Kubectl(ctx, nil, "get", "flashsale", saleName, "-n", namespace, "-o", "jsonpath={.spec.allocation}")
	if err != nil {
		return err
	}
	p.section(fmt.Sprintf("Storm: %d buyers for %s units", o.buyers, alloc))
	url, err := env.ServiceURL(ctx, namespace, saleName+"-reserve")
	if err != nil {
		return err
	}
	if err := storm(ctx, p, env, bin, dir, url, o.buyers); err != nil {
		return err
	}

	p.section("What the operator reports")
	if err := waitStatusSettled(ctx, env); err != nil {
		return err
	}
	if err := printKubectl(ctx, p, env, "get", "flashsales", "-n", namespace, "-o", "wide"); err != nil {
		return err
	}
	if err := printKubectl(ctx, p, env, "get", "flashsale", saleName, "-n", namespace, "-o",
		`jsonpath=epoch {.status.epoch}: allocation {.status.allocation} = available {.status.available} + reserved {.status.reserved} + sold {.status.sold}{"\n"}`); err != nil {
		return err
	}

	if o.keep {
		return keep(ctx, p, env, bin, dir, url)
	}
	return nil
}

// prepareDir empties the working directory, unless a kept demo still uses
// it, or it holds files and is no demo's (no demo.pid): `--dir .` must not
// wipe a checkout.
func prepareDir(d string) (string, error) {
	dir, err := filepath.Abs(d)
	if err != nil {
		return "", err
	}
	pidFile := filepath.Join(dir, "demo.pid")
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		if _, err := os.Stat(pidFile); err != nil {
			return "", fmt.Errorf("%s holds files and no demo.pid: not a demo's directory, so it is not wiped; name a new or empty --dir", dir)
		}
	}
	if b, err := os.ReadFile(pidFile); err == nil {
		// "<pid> <start time>": a pid alone could be another process's by now.
		f := strings.Fields(string(b))
		if len(f) > 0 {
			pid, err := strconv.Atoi(f[0])
			started, ok := processStart(pid)
			if err == nil && pid != os.Getpid() && ok && (len(f) < 2 || f[1] == started) {
				return "", fmt.Errorf("another demo (pid %d) is using %s: stop it with Ctrl-C, or use --dir", pid, dir)
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	started, _ := processStart(os.Getpid())
	return dir, os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+" "+started+"\n"), 0o644)
}

// processStart returns a live (not zombie) process's start time, in clock
// ticks since boot (/proc/PID/stat field 22): with the pid it names one
// process, even after the pid is reused.
func processStart(pid int) (string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // f[0] is field 3
	if len(f) < 20 || f[0] == "Z" {
		return "", false
	}
	return f[19], true
}

// runQuiet runs a command, showing its output only when it fails.
func runQuiet(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
	return nil
}

func printKubectl(ctx context.Context, p *out, env *localenv.Env, args ...string) error {
	p.command(append([]string{"kubectl"}, args...)...)
	s, err := env.Kubectl(ctx, nil, args...)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		fmt.Fprintf(p.w, "    %s\n", line)
	}
	return nil
}

// secretValue reads one key of a Secret with kubectl, as a person would.
func secretValue(ctx context.Context, env *localenv.Env, name, key string) (string, error) {
	s, err := env.Kubectl(ctx, nil, "get", "secret", name, "-n", namespace, "-o", "jsonpath={.data."+strings.ReplaceAll(key, ".", `\.`)+"}")
	if err != nil {
		return "", err
	}
	b, err := base64.StdEncoding.DecodeString(s)
	return string(b), err
}

// rel is path relative to the repository when it is inside it.
func rel(path string) string {
	if r, err := filepath.Rel(testharness.RepoRoot(), path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return path
}
