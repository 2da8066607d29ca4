package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

func TestProbesAndMetrics(t *testing.T) {
	f := newFixture(t, withAllocation(10))
	for _, p := range []string{"/healthz", "/readyz"} {
		if r := f.call(http.MethodGet, p, "", nil); r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", p, r.status, r.body)
		}
	}
	f.reserve("m", "k", 1)
	f.call(http.MethodPost, reservePath, "", reserveBody("m", "k", 1)) // 401

	m := f.call(http.MethodGet, "/metrics", "", nil)
	if m.status != http.StatusOK {
		t.Fatalf("/metrics: %d", m.status)
	}
	for _, want := range []string{
		`flashsale_api_requests_total{code="RESERVED",route="reserve"} 1`,
		`flashsale_api_requests_total{code="ADMISSION_INVALID",route="reserve"} 1`,
		`flashsale_api_request_duration_seconds_bucket{route="reserve",le=`,
		`flashsale_reserve_script_calls_total 1`,
		`flashsale_redis_script_duration_seconds_count{script="reserve"}`,
		`flashsale_ledger_batch_size_count`,
		`flashsale_stock_available{shard="0"}`,
		`flashsale_stock_reserved{shard=`,
		`flashsale_shard_open{shard="3"} 1`,
		`go_goroutines`,
	} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if n, err := testutil.GatherAndCount(f.srv.Metrics().Registry(), "flashsale_ledger_batch_size"); err != nil || n != 1 {
		t.Fatalf("batch size histogram: %d series, %v", n, err)
	}
}
func TestReadinessNeedsTheCampaign(t *testing.T) {
	f := newFixture(t)
	// A process started before the controller created the campaign is not ready;
	// it never creates the campaign itself.
	cfg := f.e.Config()
	cfg.CampaignID = "c-" + randomID()
	e, err := engine.New(cfg, f.rdb, f.l, ledger.MaterializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	early, err := New(Config{Engine: e, AdmissionKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	early.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "not in the ledger") {
		t.Fatalf("readyz without the campaign: %d %s", rec.Code, rec.Body)
	}
	if _, err := f.l.GetCampaign(context.Background(), cfg.CampaignID); err == nil {
		t.Fatal("the readiness probe created the campaign")
	}

	if err := f.l.MarkCampaignDeleted(context.Background(), f.e.Config().CampaignID); err != nil {
		t.Fatal(err)
	}
	if r := f.call(http.MethodGet, "/readyz", "", nil); r.status != http.StatusServiceUnavailable {
		t.Fatalf("readyz for a deleted campaign: %d %s", r.status, r.body)
	}
	if r := f.call(http.MethodGet, "/healthz", "", nil); r.status != http.StatusOK {
		t.Fatalf("healthz: %d", r.status)
	}
}

// Once ready, a replica stays ready while Redis is down: the replicas share
// it, and failing readiness would take them all out of the Service. Buyers
// get 503 with Retry-After instead, and checkout, which needs only the
// ledger, goes on. A replica that never saw its campaign is not ready.
func TestReadinessOutlastsARedisOutage(t *testing.T) {
	r := testharness.RedisT(t)
	f := newFixture(t, withRedis(r.Addr()))
	if got := f.call(http.MethodGet, "/readyz", "", nil); got.status != http.StatusOK {
		t.Fatalf("readyz: %d %s", got.status, got.body)
	}
	held := f.reserve("ann", "k", 1)
	// A Redis that hangs (stopped, not gone) leaves readyz answering within
	// the kubelet's 2 s probe timeout: it asks Redis nothing any more.
	if err := syscall.Kill(r.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	probe := &http.Client{Timeout: 2 * time.Second}
	resp, err := probe.Get(f.base + "/readyz")
	_ = syscall.Kill(r.PID(), syscall.SIGCONT)
	if err != nil {
		t.Fatalf("readyz while Redis hangs: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz while Redis hangs: %d", resp.StatusCode)
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if got := f.call(http.MethodGet, "/readyz", "", nil); got.status != http.StatusOK {
		t.Fatalf("readyz while Redis is down: %d %s", got.status, got.body)
	}
	res := f.call(http.MethodPost, reservePath, f.token("bob"), reserveBody("bob", "k", 1))
	if res.status != http.StatusServiceUnavailable || res.header.Get("Retry-After") == "" {
		t.Fatalf("reserve while Redis is down: %d %v %s", res.status, res.header, res.body)
	}
	if co := f.checkout("ann", held.ReservationID, "pay"); co.status != http.StatusOK {
		t.Fatalf("checkout while Redis is down: %d %s", co.status, co.body)
	}
	// The availability route needs Redis: it asks to retry, without an
	// idempotency key it does not have.
	av := f.call(http.MethodGet, availabilityPath(testSKU), "", nil)
	if av.status != http.StatusServiceUnavailable || strings.Contains(string(av.body), "idempotency_key") {
		t.Fatalf("availability while Redis is down: %d %s", av.status, av.body)
	}
	fresh, err := New(Config{Engine: f.e, AdmissionKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	fresh.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "redis") {
		t.Fatalf("readyz of a replica that never reached Redis: %d %s", rec.Code, rec.Body)
	}
}

// With MetricsElsewhere the API's listener has no /metrics: the process
// serves MetricsHandler, with the probes, on an address buyers cannot reach.
func TestMetricsElsewhere(t *testing.T) {
	f := newFixture(t, withAllocation(10), func(c *fixtureConfig) { c.api.MetricsElsewhere = true })
	f.reserve("m", "k", 1)
	if r := f.call(http.MethodGet, "/metrics", "", nil); r.status != http.StatusNotFound {
		t.Fatalf("/metrics on the API listener: %d, want 404", r.status)
	}
	for _, rt := range f.srv.Routes() {
		if rt.Name == "metrics" {
			t.Fatalf("the metrics route is registered: %+v", rt)
		}
	}
	aside := f.srv.MetricsHandler()
	get := func(method, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		aside.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec
	}
	// The probes answer on the metrics listener as on the API's port, so the
	// kubelet never queues behind buyers for a connection.
	for path, want := range map[string]string{"/healthz": `{"status":"ok"}`, "/readyz": `{"status":"ready"}`} {
		if rec := get(http.MethodGet, path); rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != want {
			t.Fatalf("%s on the metrics listener: %d %.200s, want 200 %s", path, rec.Code, rec.Body, want)
		}
	}
	if rec := get(http.MethodPost, "/readyz"); rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" ||
		!strings.Contains(rec.Body.String(), string(CodeMethodNotAllowed)) {
		t.Fatalf("POST /readyz on the metrics listener: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	if rec := get(http.MethodPost, "/api/v1/flash-sale/reserve"); rec.Code != http.StatusNotFound {
		t.Fatalf("a buyer route on the metrics listener: %d %s, want 404", rec.Code, rec.Body)
	}
	rec := get(http.MethodGet, "/metrics")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `flashsale_api_requests_total{code="RESERVED",route="reserve"} 1`) ||
		!strings.Contains(rec.Body.String(), `flashsale_api_requests_total{code="OK",route="readyz"} 1`) {
		t.Fatalf("MetricsHandler: %d %.300s", rec.Code, rec.Body.String())
	}
	// Draining fails readiness on both listeners.
	f.srv.draining.Store(true)
	if rec := get(http.MethodGet, "/readyz"); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("readyz on the metrics listener while draining: %d %s", rec.Code, rec.Body)
	}
	f.srv.draining.Store(false)
}

// Anyone can reach readyz through the sale's Service: a confirmed replica
// asks the ledger at most once per readyRecheck, whatever the number of
// requests, and requests that arrive while a query is out take the last
// answer instead of queueing more queries. A deleted campaign still takes
// the replica out once the answer it kept is that old.
func TestReadyzAsksTheLedgerOncePerRecheck(t *testing.T) {
	f := newFixture(t)
	if r := f.call(http.MethodGet, "/readyz", "", nil); r.status != http.StatusOK {
		t.Fatalf("readyz: %d %s", r.status, r.body)
	}
	before, start := f.srv.readyChecks.Load(), time.Now()
	const requests = 200
	var wg sync.WaitGroup
	var notReady atomic.Int64
	for range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := f.call(http.MethodGet, "/readyz", "", nil); r.status != http.StatusOK {
				notReady.Add(1)
			}
		}()
	}
	wg.Wait()
	queries := f.srv.readyChecks.Load() - before
	// One per readyRecheck that the requests spanned, and one more for the
	// period they began in.
	if limit := int64(time.Since(start)/readyRecheck) + 2; queries > limit || notReady.Load() != 0 {
		t.Fatalf("%d readyz requests made %d ledger queries (at most %d), %d not ready", requests, queries, limit, notReady.Load())
	}
	if err := f.l.MarkCampaignDeleted(context.Background(), f.e.Config().CampaignID); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 10*readyRecheck, "readyz to see the campaign deleted", func() bool {
		return f.call(http.MethodGet, "/readyz", "", nil).status == http.StatusServiceUnavailable
	})
}
