// Package process_test runs the built flashsale binary the way the pods do:
// reserve and sweeper processes configured by FLASHSALE_* variables, against
// real Redis and PostgreSQL, stormed by `flashsale storm`, then killed,
// terminated and audited.
package process_test

import (
	"context"
	"crypto/rand"
	bin "encoding/binary"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/promtext"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Shared for the package: the binary and the servers. Each test has its own
// database and campaign id, so tests never see each other's keys or rows.
var (
	binary   string
	sharedRS *testharness.Redis
	sharedPG *testharness.Postgres
)

// envRace=1 builds the binary with -race (when this test binary has it).
// Off by default: on two cores the instrumented processes make each storm
// about five times slower, and the same server code already runs under
// -race in its packages' tests.
const envRace = "FLASHSALE_PROCESS_RACE"

// envSeed replays a test's storms: the seed a test prints seeds the storm's
// buyers (their choices and names, so their home shards) and every reserve
// process's steal draws (--steal-seed). Unset, each test draws one.
const envSeed = "FLASHSALE_PROCESS_SEED"

// envLogs set prints every process's log tail, not only a failed test's.
const envLogs = "FLASHSALE_PROCESS_LOGS"

func TestMain(m *testing.M) {
	testharness.Main(m, func() error {
		dir, err := testharness.TempDir("process")
		if err != nil {
			return err
		}
		if binary, err = build(dir); err != nil {
			return err
		}
		if sharedRS, err = testharness.StartRedis(); err != nil {
			return err
		}
		sharedPG, err = testharness.StartPostgres()
		return err
	})
}

// build compiles ./cmd/flashsale once.
func build(dir string) (string, error) {
	out := filepath.Join(dir, "flashsale")
	args := []string{"build", "-o", out}
	if raceEnabled && os.Getenv(envRace) == "1" {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/flashsale")...)
	cmd.Dir = filepath.Join("..", "..")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return out, nil
}

// Campaign settings of every test: the storm, with a short TTL so the
// sweepers have work during the test.
const (
	allocation = 1000
	shards     = 10
	ttl        = 3 * time.Second
	grace      = time.Second
	sku        = "itm-ps5-pro"
	adminKey   = "process-test-admission-key-0123456789"
	// sweepInterval is short so that released units come back within a test.
	sweepInterval = 250 * time.Millisecond
)

// campaign is one seeded FlashSale on a fresh database.
type campaign struct {
	t     *testing.T
	id    string
	dsn   string
	redis string // address of its Redis
	dir   string // logs and files of this test
	eng   *engine.Engine
	l     *ledger.Ledger
	seed  uint64 // the storm's and the reserve processes' (envSeed)
	ttl   time.Duration
}

// testSeed is envSeed's value, or a random one; the test logs it.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	var seed uint64
	if s := os.Getenv(envSeed); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			t.Fatalf("%s=%q: want a positive integer", envSeed, s)
		}
		seed = n
	} else {
		var b [8]byte
		_, _ = rand.Read(b[:])
		seed = bin.LittleEndian.Uint64(b[:]) | 1 // 0 would ask for a random one
	}
	t.Logf("seed %d (%s=%d replays the storm's buyers and the steal draws)", seed, envSeed, seed)
	return seed
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newCampaign(t *testing.T) *campaign {
	t.Helper()
	return newCampaignOn(t, sharedRS.Addr())
}

// newCampaignOn is newCampaign on the Redis at redisAddr.
func newCampaignOn(t *testing.T, redisAddr string) *campaign {
	t.Helper()
	return newCampaignWith(t, redisAddr, ttl)
}

// newCampaignWith is newCampaignOn with reservations living for resTTL.
func newCampaignWith(t *testing.T, redisAddr string, resTTL time.Duration) *campaign {
	t.Helper()
	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	// Each process keeps its pool small: four processes and the test share
	// PostgreSQL's 100 connections.
	dsn += "&pool_max_conns=16"
	c := &campaign{t: t, id: "c-" + randomID(), dsn: dsn, redis: redisAddr, dir: t.TempDir(), seed: testSeed(t), ttl: resTTL}
	ctx := context.Background()
	if c.l, err = ledger.Open(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.l.Close)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = rdb.Close() })
	cfg := engine.Config{
		CampaignID: c.id, Namespace: "shop", Name: "ps5-drop", SKU: sku, Allocation: allocation,
		Shards: shards, MaxPerUser: 1, TTL: resTTL, Grace: grace, StealProbes: 2,
		IDSecret: config.DeriveIDSecret([]byte(adminKey)),
	}
	if c.eng, err = engine.New(cfg, rdb, c.l, ledger.MaterializerConfig{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.eng.Close)
	if _, err := c.eng.Seed(ctx, stock.StateOpen); err != nil {
		t.Fatal(err)
	}
	return c
}

// env is what the controller would set on a pod of this campaign.
func (c *campaign) env(extra ...string) []string {
	env := []string{
		config.EnvCampaignID + "=" + c.id,
		config.EnvNamespace + "=shop",
		config.EnvName + "=ps5-drop",
		config.EnvSKU + "=" + sku,
		config.EnvShards + "=" + strconv.Itoa(shards),
		config.EnvMaxPerUser + "=1",
		config.EnvStealProbes + "=2",
		config.EnvTTL + "=" + c.ttl.String(),
		config.EnvGracePeriod + "=" + grace.String(),
		config.EnvRedisMode + "=standalone",
		config.EnvRedisAddresses + "=" + c.redis,
		config.EnvPostgresDSN + "=" + c.dsn,
		config.EnvAdmissionKey + "=" + adminKey,
		config.EnvStealSeed + "=" + strconv.FormatUint(c.seed, 10),
	}
	return append(append(cleanEnviron(), env...), extra...)
}

// cleanEnviron is this process's environment without anything that would
// change the children's behaviour: no FLASHSALE_* from the caller, and no
// Kubernetes (the sweepers must elect with the advisory lock here).
func cleanEnviron() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FLASHSALE_") || k == "KUBERNETES_SERVICE_HOST" || k == "KUBECONFIG" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func (c *campaign) counts() engine.Counts {
	c.t.Helper()
	n, err := c.eng.Counts(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

// process is one running flashsale subcommand.
type process struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	log    string
	addr   string // its --listen address
	done   chan struct{}
	result error // Wait's error, set before done is closed
}

// start runs `flashsale <args>` with env, its output in a log file that is
// printed if the test fails. The process dies with the test binary
// (Pdeathsig) and is killed at cleanup if still running.
func (c *campaign) start(name string, env []string, args ...string) *process {
	c.t.Helper()
	port, err := testharness.FreePort()
	if err != nil {
		c.t.Fatal(err)
	}
	p := &process{t: c.t, name: name, log: filepath.Join(c.dir, name+".log"),
		addr: "127.0.0.1:" + strconv.Itoa(port), done: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(binary, args...)
	p.cmd.Env = append(env, config.EnvListen+"="+p.addr)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { p.result = p.cmd.Wait(); close(p.done) }()
	c.t.Cleanup(func() {
		p.kill()
		if c.t.Failed() || os.Getenv(envLogs) != "" {
			c.t.Logf("--- %s log (tail) ---\n%s", p.name, tail(p.log, 40))
		}
	})
	return p
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and reaps the process.
func (p *process) kill() {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// terminate sends SIGTERM, waits up to timeout and returns the exit code.
func (p *process) terminate(timeout time.Duration) int {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %s of SIGTERM", p.name, timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// waitReady polls /readyz until it answers 200.
func (p *process) waitReady(timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if p.exited() {
			p.t.Fatalf("%s exited before it was ready (%v):\n%s", p.name, p.result, tail(p.log, 30))
		}
		resp, err := httpClient.Get("http://" + p.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s not ready after %s (%v):\n%s", p.name, timeout, err, tail(p.log, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metrics reads the process's /metrics as name{labels} → value.
func (p *process) metrics() (map[string]float64, error) {
	resp, err := httpClient.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return promtext.Parse(resp.Body)
}
