// Package e2e_test drives the whole system the way its users do: kubectl
// apply and get against a Kubernetes API server, HTTP against the reserve
// Service, `flashsale storm` and `flashsale token` from the built binary. The
// operator and the local pod runner run as processes of that binary, started
// once for the package by internal/localenv, with Redis and PostgreSQL.
//
// Each test works in its own namespace. Tests that storm take turns (the
// machine may have two cores); the others run beside them.
package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
	"github.com/flashsale-dev/flashsale-operator/internal/podrunner"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

var (
	env    *localenv.Env
	ledger *pgxpool.Pool
	// storms serialises the tests that put load on the machine.
	storms sync.Mutex
)

// admissionKey is the waiting-room key of the tests' own namespaces.
const admissionKey = "e2e-admission-key-5b0c2f7e9a1d4c8b"

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := testharness.RunDir("e2e")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// PostgreSQL runs as an unprivileged user when the tests run as root:
		// it must reach its directory below this one.
		if err := os.Chmod(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		flag.Parse()
		progress := func(step string, took time.Duration) {
			if testing.Verbose() {
				fmt.Fprintf(os.Stderr, "e2e: %s (%.1fs)\n", step, took.Seconds())
			}
		}
		start := time.Now()
		bin := filepath.Join(dir, "flashsale")
		build := exec.Command("go", "build", "-o", bin, "./cmd/flashsale")
		build.Dir = testharness.RepoRoot()
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build ./cmd/flashsale: %v\n%s", err, out)
			return 1
		}
		progress("go build ./cmd/flashsale", time.Since(start))
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		env, err = localenv.Start(ctx, localenv.Options{
			Dir: filepath.Join(dir, "env"), Binary: bin,
			StatusRefresh: 500 * time.Millisecond, MaxGrace: 5 * time.Second, RestartBackoff: 200 * time.Millisecond,
			Progress: progress,
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() {
			start := time.Now()
			if err := env.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "stopping the environment:", err)
			}
			_ = testharness.CloseAll()
			progress("environment stopped", time.Since(start))
		}()
		if ledger, err = pgxpool.New(ctx, env.DSN); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer ledger.Close()
		// Processes left running by go test's timeout would wait for the
		// next run's sweep.
		cancelStop := testharness.StopBeforeTimeout("e2e", dir, env.Close)
		code := m.Run()
		cancelStop()
		if code != 0 {
			if kept, err := testharness.KeepLogs("e2e", dir); err != nil {
				fmt.Fprintln(os.Stderr, "keeping the logs:", err)
			} else {
				fmt.Fprintf(os.Stderr, "logs of the operator, the pod runner, every replica and the servers are kept in %s\n", kept)
			}
		}
		return code
	}()
	os.Exit(code)
}

// kubectl runs kubectl against the environment and fails the test on error.
func kubectl(t *testing.T, stdin []byte, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := env.Kubectl(ctx, stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sale is one FlashSale under test and what it takes to talk to it.
type sale struct {
	ns, name, uid, sku string
	url                string // the reserve Service, exposed by the pod runner
	redisAddr          string
	keyFile            string
}

var nsRuns sync.Map // base name -> *atomic.Int32

// namespaceName is base, then base-2, base-3... when a test runs again in the
// same environment (go test -count).
func namespaceName(base string) string {
	n, _ := nsRuns.LoadOrStore(base, new(atomic.Int32))
	if i := n.(*atomic.Int32).Add(1); i > 1 {
		return fmt.Sprintf("%s-%d", base, i)
	}
	return base
}

// newNamespace creates a namespace with the three Secrets a FlashSale refers
// to, made with kubectl the way an operator of the shop would.
func newNamespace(t *testing.T, ns, redisAddr string) {
	t.Helper()
	kubectl(t, nil, "create", "namespace", ns)
	kubectl(t, nil, "create", "secret", "generic", "shop-redis", "-n", ns, "--from-literal=addresses="+redisAddr)
	kubectl(t, nil, "create", "secret", "generic", "shop-ledger", "-n", ns, "--from-literal=dsn="+env.DSN)
	kubectl(t, nil, "create", "secret", "generic", "waiting-room", "-n", ns, "--from-literal=hmac-key="+admissionKey)
}

// applySale renders testdata/<file> with vars (Go template), applies it with
// kubectl, waits for the FlashSale to be Ready and deletes it at the end of the
// test.
func applySale(t *testing.T, ns, file string, vars map[string]any) *sale {
	t.Helper()
	tmpl, err := template.ParseFiles(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, vars); err != nil {
		t.Fatal(err)
	}
	name := strings.TrimSuffix(kubectl(t, b.Bytes(), "apply", "-n", ns, "-f", "-", "-o", "jsonpath={.metadata.name}"), "\n")
	t.Cleanup(func() {
		if _, err := env.Kubectl(context.Background(), nil, "delete", "flashsale", name, "-n", ns, "--ignore-not-found", "--timeout=60s"); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return waitReady(t, ns, name)
}

// waitReady waits with kubectl for the FlashSale's Ready condition and finds
// its reserve Service's local URL.
func waitReady(t *testing.T, ns, name string) *sale {
	t.Helper()
	if _, err := env.Kubectl(context.Background(), nil, "wait", "-n", ns, "--for=condition=Ready", "flashsale/"+name, "--timeout=90s"); err != nil {
		// What the sale and its pods say, for the log.
		t.Fatalf("%v\n%s\n%s", err, kubectl(t, nil, "get", "flashsale", name, "-n", ns, "-o", "yaml"),
			kubectl(t, nil, "get", "deployments,pods", "-n", ns, "-o", "wide"))
	}
	fs := getSale(t, ns, name)
	s := &sale{ns: ns, name: name, uid: string(fs.UID), sku: fs.Spec.SKU}
	s.redisAddr = secretValue(t, ns, fs.Spec.Redis.SecretRef.Name, "addresses")
	key := secretValue(t, ns, fs.Spec.Admission.SecretRef.Name, "hmac-key")
	s.keyFile = filepath.Join(t.TempDir(), "hmac-key")
	if err := os.WriteFile(s.keyFile, []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url, err := env.ServiceURL(ctx, ns, name+"-reserve")
	if err != nil {
		t.Fatal(err)
	}
	s.url = url
	return s
}

func secretValue(t *testing.T, ns, name, key string) string {
	t.Helper()
	var sec struct {
		Data map[string][]byte `json:"data"`
	}
	if err := json.Unmarshal([]byte(kubectl(t, nil, "get", "secret", name, "-n", ns, "-o", "json")), &sec); err != nil {
		t.Fatal(err)
	}
	return string(sec.Data[key])
}

// getSale reads the FlashSale with kubectl.
func getSale(t *testing.T, ns, name string) *flashsalev1alpha1.FlashSale {
	t.Helper()
	var fs flashsalev1alpha1.FlashSale
	if err := json.Unmarshal([]byte(kubectl(t, nil, "get", "flashsale", name, "-n", ns, "-o", "json")), &fs); err != nil {
		t.Fatal(err)
	}
	return &fs
}

// eventually polls cond every interval until it returns "" or timeout passes.
func eventually(t *testing.T, timeout, interval time.Duration, cond func() string) {
	t.Helper()
	salecheck.Eventually(t, timeout, interval, cond)
}

// stormCmd prepares `flashsale storm --json` against the sale, with its audit
// reading the sale's Redis and ledger as the reserve pods do.
func (s *sale) stormCmd(ctx context.Context, args ...string) *exec.Cmd {
	all := append([]string{"storm", "--json", "--quiet", "--url", s.url, "--sku", s.sku,
		"--campaign-id", s.uid, "--redis-addresses", s.redisAddr, "--key-file", s.keyFile}, args...)
	cmd := exec.CommandContext(ctx, env.Binary, all...)
	cmd.Env = append(os.Environ(), config.EnvPostgresDSN+"="+env.DSN)
	return cmd
}

// runningStorm is a storm in the background.
type runningStorm struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	err            error
	cancel         context.CancelFunc
}

func (s *sale) startStorm(t *testing.T, args ...string) *runningStorm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	r := &runningStorm{cmd: s.stormCmd(ctx, args...), done: make(chan struct{}), cancel: cancel}
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	if err := r.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// report waits for the storm and returns its report; the test fails when the
// storm could not run, not when its audit failed (callers check that).
func (r *runningStorm) report(t *testing.T) *storm.Report {
	t.Helper()
	<-r.done
	r.cancel()
	var rep storm.Report
	if err := json.Unmarshal(r.stdout.Bytes(), &rep); err != nil {
		t.Fatalf("flashsale storm: %v (%v)\nstdout: %s\nstderr: %s", r.err, err, r.stdout.String(), r.stderr.String())
	}
	t.Logf("storm: %d journeys, %d requests in %.1fs, %d acknowledged, %d confirmed, %d cancelled, %d abandoned; outcomes %v",
		rep.Journeys, rep.Requests, rep.ElapsedSeconds, rep.Acked, rep.Confirmed, rep.Cancelled, rep.Abandoned, rep.Outcomes)
	if a := rep.Audit; a != nil {
		t.Logf("audit: allocation %d = available %d + reserved %d + sold %d; pending %d; oversold %d; settled %v; failures %v",
			a.Allocation, a.Available, a.Reserved, a.Sold, a.Pending, a.Oversold, a.Settled, a.Failures)
	}
	return &rep
}

// underway waits until the storm has written n of the sale's orders, and
// fails the test if the storm ended first: the fault that follows then lands
// while the storm runs, every run.
func (r *runningStorm) underway(t *testing.T, s *sale, n int64) {
	t.Helper()
	salecheck.OrdersAtLeast(t, ledger, s.uid, n, time.Minute)
	select {
	case <-r.done:
		t.Fatalf("the storm ended before the fault: %v\nstderr: %s", r.err, r.stderr.String())
	default:
	}
}

func (s *sale) storm(t *testing.T, args ...string) *storm.Report {
	t.Helper()
	return s.startStorm(t, args...).report(t)
}

// runnerState is the pod runner's view, from its admin endpoint.
func runnerState(t *testing.T) podrunner.State {
	t.Helper()
	st, err := env.RunnerAPI.State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// check is the sale as the checks both suites share reach it.
func (s *sale) check() *salecheck.Sale {
	return &salecheck.Sale{Env: env, NS: s.ns, Name: s.name, UID: s.uid, SKU: s.sku, URL: s.url, Key: s.keyFile}
}
