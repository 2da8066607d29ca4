/*
Copyright 2026 The flashsale-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package reserve

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net"
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

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// buildBinary builds cmd/flashsale into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "flashsale")
	out, err := exec.Command(goBin, "build", "-o", bin, "github.com/flashsale-dev/flashsale-operator/cmd/flashsale").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// childEnv is this process's environment without FLASHSALE_* variables, plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FLASHSALE_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// TestBinaryServesAndExitsOnSIGTERM runs the built `flashsale reserve` the way a
// pod does (configuration in the environment, secrets in files), with a token from
// the built `flashsale token`: it gets ready once the campaign exists, serves a
// reservation whose row is in the ledger, logs JSON without secrets, and exits 0
// on SIGTERM.
func TestBinaryServesAndExitsOnSIGTERM(t *testing.T) {
	startShared(t)
	bin := buildBinary(t)
	ctx := context.Background()

	id := make([]byte, 8)
	_, _ = rand.Read(id)
	campaignID := "c-" + hex.EncodeToString(id)
	const (
		sku      = "itm-binary"
		key      = "binary-admission-key-0123456789"
		password = "pg-password-never-logged"
	)
	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	// Loopback connections are trusted, so the password is never checked: it is
	// there to show that it is not logged.
	dsnWithPassword := strings.Replace(dsn, "postgres://postgres@", "postgres://postgres:"+password+"@", 1)
	if dsnWithPassword == dsn {
		t.Fatalf("unexpected DSN shape %q", dsn)
	}
	dir := t.TempDir()
	keyFile, dsnFile := filepath.Join(dir, "hmac-key"), filepath.Join(dir, "dsn")
	for f, v := range map[string]string{keyFile: key + "\n", dsnFile: dsnWithPassword + "\n"} {
		if err := os.WriteFile(f, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port, err := testharness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	metricsPort, err := testharness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := "127.0.0.1:" + strconv.Itoa(metricsPort)
	env := childEnv(
		config.EnvCampaignID+"="+campaignID, config.EnvNamespace+"=shop", config.EnvName+"=binary",
		config.EnvSKU+"="+sku, config.EnvShards+"=3", config.EnvMaxPerUser+"=1", config.EnvTTL+"=1m",
		config.EnvRedisAddresses+"="+sharedRedis.Addr(),
		config.EnvPostgresDSN+config.FileSuffix+"="+dsnFile,
		config.EnvAdmissionKey+config.FileSuffix+"="+keyFile,
		config.EnvListen+"="+addr, config.EnvMetricsListen+"="+metricsAddr,
		// Connections that send nothing hold their places while the bound is
		// checked below.
		config.EnvReadHeaderTimeout+"=2m",
	)

	var logs testharness.SyncBuffer
	// Under 1024 open files, as a container runtime may set them: too few
	// for the default max in flight, which the process says at start, and
	// it holds at most 1024 - 226 buyers' connections.
	// (Lowering a limit needs no privilege; util-linux's prlimit is among
	// hack/install-deps.sh's packages.)
	proc := exec.Command("prlimit", "--nofile=1024:1024", bin, "reserve")
	proc.Env, proc.Stdout, proc.Stderr = env, &logs, &logs
	proc.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- proc.Wait() }()
	t.Cleanup(func() {
		_ = proc.Process.Kill()
		if t.Failed() {
			t.Logf("reserve logs:\n%s", logs.String())
		}
	})

	base := "http://" + addr
	get := func(path string) int {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			select {
			case err := <-exited:
				t.Fatalf("reserve exited (%v) while waiting for %s", err, what)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// Serving, but not ready: the campaign is not in the ledger yet.
	waitFor("/healthz", func() bool { return get("/healthz") == http.StatusOK })
	if code := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before the campaign exists: %d", code)
	}

	// The controller's part: create and seed the campaign.
	l, err := ledger.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr()})
	defer rdb.Close()
	e, err := engine.New(engine.Config{
		CampaignID: campaignID, Namespace: "shop", Name: "binary", SKU: sku, Allocation: 30, Shards: 3,
		MaxPerUser: 1, TTL: time.Minute, StealProbes: 2, IDSecret: config.DeriveIDSecret([]byte(key)),
	}, rdb, l, ledger.MaterializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := e.Seed(ctx, stock.StateOpen); err != nil {
		t.Fatal(err)
	}
	waitFor("/readyz", func() bool { return get("/readyz") == http.StatusOK })

	// A token from `flashsale token`, the key from its file.
	tokCmd := exec.Command(bin, "token", "--sku", sku, "--user", "u-bin", "--ttl", "5m", "--key-file", keyFile)
	tokCmd.Env = childEnv()
	out, err := tokCmd.Output()
	if err != nil {
		t.Fatalf("flashsale token: %v", err)
	}
	token := strings.TrimSpace(string(out))

	body := `{"item_id":"` + sku + `","user_id":"u-bin","quantity":1,"idempotency_key":"k-1"}`
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/flash-sale/reserve", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		ReservationID string `json:"reservation_id"`
		Status        string `json:"status"`
	}
	err = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || err != nil || res.Status != "reserved" {
		t.Fatalf("reserve: %d %+v %v", resp.StatusCode, res, err)
	}
	if o, err := l.GetOrder(ctx, campaignID, res.ReservationID); err != nil || o.Status != ledger.StatusPending || o.UserID != "u-bin" {
		t.Fatalf("ledger row %+v, %v", o, err)
	}

	// The metrics on their own address, not on the buyers'.
	if code := get("/metrics"); code != http.StatusNotFound {
		t.Fatalf("/metrics on the API address: %d, want 404", code)
	}
	mresp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mbody, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if mresp.StatusCode != http.StatusOK || !strings.Contains(string(mbody), `flashsale_api_requests_total{code="RESERVED",route="reserve"} 1`) {
		t.Fatalf("/metrics on %s: %d %.300s", metricsAddr, mresp.StatusCode, mbody)
	}

	fillTheBound(t, addr, metricsAddr, 1024-226)

	if err := proc.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("reserve exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("reserve did not exit within 30s of SIGTERM")
	}

	// Logs: JSON lines, no secret values.
	out = []byte(logs.String())
	for _, secret := range []string{key, password} {
		if bytes.Contains(out, []byte(secret)) {
			t.Fatalf("the logs hold a secret:\n%s", out)
		}
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
	}
	if !strings.Contains(lines[len(lines)-1], `"msg":"stopped"`) {
		t.Fatalf("last log line %q", lines[len(lines)-1])
	}
	if !strings.Contains(string(out), `"msg":"open-file limit below max in flight"`) || !strings.Contains(string(out), `"files":1024,"maxInFlight":16384,"ownFiles":226,"maxConnections":798`) {
		t.Fatalf("no warning that 1024 files are too few for the default max in flight:\n%s", out)
	}
}

func TestDebugListenerServesProfiles(t *testing.T) {
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	addr, stop, err := serveDebug("127.0.0.1:0", discard)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile") {
		t.Fatalf("%d %.200s", resp.StatusCode, body)
	}
	if _, _, err := serveDebug("256.0.0.1:1", discard); err == nil {
		t.Fatal("a bad --debug-listen address must be refused")
	}
}

// fillTheBound checks the bound on the API's connections from both sides:
// with one place left a request is answered; with every place held by a
// connection that sends nothing, a request on one more is not, while the
// probes on the metrics address are. Once the held connections close, that
// request is answered.
func fillTheBound(t *testing.T, addr, metricsAddr string, bound int) {
	t.Helper()
	if got := metricValue(t, metricsAddr, "flashsale_api_connections_max"); got != float64(bound) {
		t.Fatalf("flashsale_api_connections_max %v, want %d", got, bound)
	}
	// NaN where the kernel does not report its queue (a sandbox's).
	if got := metricValue(t, metricsAddr, "flashsale_api_connections_waiting"); got != 0 && !math.IsNaN(got) {
		t.Fatalf("flashsale_api_connections_waiting %v below the bound, want 0", got)
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	hold := func(n int) {
		for range n {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
	}
	ask := func(wait time.Duration) (net.Conn, *bufio.Reader, string, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		_ = c.SetReadDeadline(time.Now().Add(wait))
		line, err := r.ReadString('\n')
		return c, r, line, err
	}

	hold(bound - 1)
	c, _, line, err := ask(10 * time.Second)
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("with %d connections held, one more was answered %q, %v; want 200", bound-1, line, err)
	}
	c.Close()
	hold(1)
	late, answer, line, err := ask(time.Second)
	if err == nil {
		t.Fatalf("a connection past %d held ones was answered: %q", bound, line)
	}

	probes := &http.Client{Timeout: 2 * time.Second} // the kubelet's timeout in the operator's pods
	for path, want := range map[string]string{"/healthz": `{"status":"ok"}`, "/readyz": `{"status":"ready"}`} {
		resp, err := probes.Get("http://" + metricsAddr + path)
		if err != nil {
			t.Fatalf("%s on the metrics address while the API's connections are at their bound: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != want {
			t.Fatalf("%s on the metrics address: %d %.200s, want 200 %s", path, resp.StatusCode, b, want)
		}
	}
	if got := metricValue(t, metricsAddr, "flashsale_api_connections"); got != float64(bound) {
		t.Fatalf("flashsale_api_connections %v at the bound, want %d", got, bound)
	}
	if got := metricValue(t, metricsAddr, "flashsale_api_connections_full_total"); got < 1 {
		t.Fatalf("flashsale_api_connections_full_total %v at the bound, want at least 1", got)
	}
	if got := metricValue(t, metricsAddr, "flashsale_api_connections_waiting"); got != 1 && !math.IsNaN(got) {
		t.Fatalf("flashsale_api_connections_waiting %v with one connection past the bound, want 1", got)
	}

	for _, c := range held {
		c.Close()
	}
	held = nil
	_ = late.SetReadDeadline(time.Now().Add(20 * time.Second))
	if line, err := answer.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("once the held connections closed, the late one was answered %q, %v; want 200", line, err)
	}
}

// metricValue reads one unlabelled series from the metrics address.
func metricValue(t *testing.T, metricsAddr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q", name, line)
			}
			return f
		}
	}
	t.Fatalf("no %s in the metrics", name)
	return 0
}
