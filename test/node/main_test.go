// Package node_test runs the operator on a real node: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, containerd, the kubelet and
// kube-proxy (internal/testharness.Cluster, through internal/localenv). The
// operator is deployed from config/default as a pod of its image; its
// reserve and sweeper pods run under the kubelet; storms go through the
// reserve Service's ClusterIP, that is through kube-proxy, from inside the
// node's network namespace.
//
// Redis and PostgreSQL stay processes on this machine's loopback, forwarded
// into the node's namespace: the tests kill, restart and inspect them the
// way the other suites do, and no image of them has to be assembled.
package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

var (
	env *localenv.Env
	// ledger is the environment's ledger, for the tests' own queries.
	ledger *pgxpool.Pool
	// skipReason is set when this machine cannot run a node; every test
	// skips with it.
	skipReason string
	storms     sync.Mutex
)

func TestMain(m *testing.M) {
	flag.Parse()
	if err := testharness.NodeSupported(); errors.Is(err, testharness.ErrNodeUnsupported) {
		skipReason = err.Error()
		fmt.Fprintln(os.Stderr, "node tests skipped:", skipReason)
		os.Exit(m.Run())
	} else if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		dir, err := testharness.RunDir("node-e2e")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		progress := func(step string, took time.Duration) {
			fmt.Fprintf(os.Stderr, "node: %s (%.1fs)\n", step, took.Seconds())
		}
		// The images' binaries alone took over 10 minutes from a cold build
		// cache on a busy 2-core machine.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		env, err = localenv.Start(ctx, localenv.Options{
			Dir: filepath.Join(dir, "env"), Node: true,
			StatusRefresh: 500 * time.Millisecond, Progress: progress,
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() {
			start := time.Now()
			if err := env.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "stopping the node:", err)
			}
			_ = testharness.CloseAll()
			progress("node stopped", time.Since(start))
		}()
		if ledger, err = pgxpool.New(ctx, env.DSN); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer ledger.Close()
		// A node left running by go test's timeout would hold its pods,
		// mounts and namespace until the next run.
		cancelStop := testharness.StopBeforeTimeout("node", dir, env.Close)
		code := m.Run()
		cancelStop()
		if code != 0 {
			if kept, err := testharness.KeepLogs("node", dir); err != nil {
				fmt.Fprintln(os.Stderr, "keeping the logs:", err)
			} else {
				fmt.Fprintf(os.Stderr, "logs of the node, the operator, every pod and the servers are kept in %s\n", kept)
			}
		}
		return code
	}()
	os.Exit(code)
}

func needNode(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

func kubectl(t *testing.T, stdin []byte, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := env.Kubectl(ctx, stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sale is a FlashSale under test.
type sale struct {
	ns, name, uid, sku, url, redisAddr, keyFile string
}

// check is the sale as the checks test/e2e shares reach it.
func (s *sale) check() *salecheck.Sale {
	return &salecheck.Sale{Env: env, NS: s.ns, Name: s.name, UID: s.uid, SKU: s.sku, URL: s.url, Key: s.keyFile}
}

// waitReady waits for the FlashSale's Ready condition and its Service's
// ready endpoints.
func waitReady(t *testing.T, ns, name string) *sale {
	t.Helper()
	kubectl(t, nil, "wait", "-n", ns, "--for=condition=Ready", "flashsale/"+name, "--timeout=170s")
	s := &sale{ns: ns, name: name}
	f := strings.Fields(kubectl(t, nil, "get", "flashsale", name, "-n", ns, "-o", "jsonpath={.metadata.uid} {.spec.sku}"))
	s.uid, s.sku = f[0], f[1]
	s.redisAddr = env.SecretValues()["shop-redis"]["addresses"]
	s.keyFile = filepath.Join(t.TempDir(), "hmac-key")
	key := secretValue(t, ns, "waiting-room", "hmac-key")
	if err := os.WriteFile(s.keyFile, []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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

// runStorm runs `flashsale storm` inside the node's namespace against the
// Service's ClusterIP, with its audit reading Redis and the ledger as the
// pods do. It may run outside the test's goroutine.
func (s *sale) runStorm(args ...string) (*storm.Report, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	all := append([]string{"storm", "--json", "--quiet", "--url", s.url, "--sku", s.sku,
		"--campaign-id", s.uid, "--redis-addresses", s.redisAddr, "--key-file", s.keyFile}, args...)
	cmd := env.Command(ctx, env.Binary, all...)
	cmd.Env = append(os.Environ(), config.EnvPostgresDSN+"="+env.PodDSN)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var rep storm.Report
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		return nil, fmt.Errorf("flashsale storm: %v (%v)\nstdout: %s\nstderr: %s", err, jerr, stdout.String(), stderr.String())
	}
	return &rep, nil
}

// storm is runStorm on the test's goroutine.
func (s *sale) storm(t *testing.T, args ...string) *storm.Report {
	t.Helper()
	rep, err := s.runStorm(args...)
	if err != nil {
		t.Fatal(err)
	}
	logStorm(t, rep)
	return rep
}

func logStorm(t *testing.T, rep *storm.Report) {
	t.Helper()
	t.Logf("storm: %d journeys, %d requests in %.1fs, %d acknowledged, %d confirmed, %d cancelled; outcomes %v",
		rep.Journeys, rep.Requests, rep.ElapsedSeconds, rep.Acked, rep.Confirmed, rep.Cancelled, rep.Outcomes)
}

// eventually polls cond every half second for up to two minutes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, 2*time.Minute, what, cond)
}

func eventuallyWithin(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// podStates lists the namespace's pods as "name phase ready restarts".
func podStates(t *testing.T, ns string) []string {
	t.Helper()
	out := kubectl(t, nil, "get", "pods", "-n", ns, "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.status.containerStatuses[0].ready} {.status.containerStatuses[0].restartCount}{"\n"}{end}`)
	return strings.Split(strings.TrimSpace(out), "\n")
}
