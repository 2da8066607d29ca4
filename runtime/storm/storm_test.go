package storm

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

func TestStormCountsWhatTheServerDid(t *testing.T) {
	f := newFakeAPI(300)
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	var progress []Progress
	var pmu sync.Mutex
	cfg := baseConfig(srv.URL)
	cfg.Progress = func(p Progress) { pmu.Lock(); progress = append(progress, p); pmu.Unlock() }
	cfg.ProgressEvery = 5 * time.Millisecond
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Journeys != 2000 {
		t.Fatalf("%d journeys, want 2000", res.Journeys)
	}
	if res.Requests != f.requests.Load() {
		t.Fatalf("storm counted %d requests, the server saw %d", res.Requests, f.requests.Load())
	}
	if f.badTokens.Load() != 0 {
		t.Fatalf("%d requests with a wrong token", f.badTokens.Load())
	}
	// Every reservation the server made was acknowledged to the storm once.
	f.mu.Lock()
	issued := slices.Sorted(slices.Values(f.issued))
	f.mu.Unlock()
	if !slices.Equal(res.Acked, issued) {
		t.Fatalf("acked %d ids, the server issued %d", len(res.Acked), len(issued))
	}
	if paid := f.with("paid"); !slices.Equal(res.Confirmed, paid) {
		t.Fatalf("confirmed %d, the server has %d paid", len(res.Confirmed), len(paid))
	}
	if c := f.with("cancelled"); !slices.Equal(res.Cancelled, c) {
		t.Fatalf("cancelled %d, the server has %d", len(res.Cancelled), len(c))
	}
	if got := int64(len(res.Confirmed)+len(res.Cancelled)) + res.Abandoned; got != int64(len(res.Acked)) {
		t.Fatalf("confirmed+cancelled+abandoned = %d, acked %d", got, len(res.Acked))
	}
	// Cancelled units were sold again, so more than the stock was acknowledged.
	if len(res.Acked) <= 300 || len(res.Cancelled) == 0 || len(res.Confirmed) == 0 || res.Abandoned == 0 {
		t.Fatalf("acked %d confirmed %d cancelled %d abandoned %d", len(res.Acked), len(res.Confirmed), len(res.Cancelled), res.Abandoned)
	}
	reserve := res.Outcomes[OpReserve]
	if sum(reserve) != 2000 || reserve["201"]+res.Outcomes[OpRetry]["201"] != int64(len(issued)) || reserve["410 SOLD_OUT"] == 0 {
		t.Fatalf("reserve outcomes %v", reserve)
	}
	retries := sum(res.Outcomes[OpRetry])
	if retries < 300 || retries > 500 { // 20% of 2000, loosely
		t.Fatalf("%d retries for a ratio of 0.2", retries)
	}
	if len(res.IdempotencyViolations) != 0 {
		t.Fatalf("violations %v", res.IdempotencyViolations)
	}
	if l := res.Latency[OpReserve]; l.Count != 2000 || l.P50 <= 0 || l.P50 > l.P99 || l.P99 > l.Max {
		t.Fatalf("reserve latency %+v", l)
	}
	pmu.Lock()
	defer pmu.Unlock()
	if len(progress) == 0 || !progress[len(progress)-1].Final || progress[len(progress)-1].Journeys != 2000 {
		t.Fatalf("progress %+v", progress)
	}
	if r := NewReport(cfg, res, nil); !r.OK {
		t.Fatal("report not OK")
	}
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

func TestStormDetectsBrokenIdempotency(t *testing.T) {
	f := newFakeAPI(1000)
	f.replayNewID = true
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	cfg := baseConfig(srv.URL)
	cfg.Buyers, cfg.RetryRatio = 200, 1
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IdempotencyViolations) != 200 {
		t.Fatalf("%d violations, want 200", len(res.IdempotencyViolations))
	}
	if NewReport(cfg, res, nil).OK {
		t.Fatal("a report with violations is OK")
	}
}

// A retry of an acknowledged request, sent while its reservation is held,
// must replay it: a 201 (a second reservation) or a refusal is a violation.
// Once the reservation may have lapsed, a refusal says nothing.
func TestStormDetectsUnrecognisedReplays(t *testing.T) {
	for _, tc := range []struct {
		answer     string
		expiresIn  time.Duration
		violations bool
	}{
		{"201", time.Minute, true},
		{"LIMIT_EXCEEDED", time.Minute, true},
		{"LIMIT_EXCEEDED", -time.Minute, false}, // lapsed: the key's unit may be gone
		{"LIMIT_EXCEEDED", 0, false},            // no expiry given
		{"", time.Minute, false},
	} {
		t.Run(fmt.Sprintf("%s/%s", tc.answer, tc.expiresIn), func(t *testing.T) {
			f := newFakeAPI(1000)
			f.replayAnswer, f.expiresIn = tc.answer, tc.expiresIn
			srv := httptest.NewServer(f.handler())
			defer srv.Close()
			cfg := baseConfig(srv.URL)
			cfg.Buyers, cfg.RetryRatio = 100, 1
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(res.IdempotencyViolations); tc.violations && got != 100 || !tc.violations && got != 0 {
				t.Fatalf("%d violations (%v)", got, res.IdempotencyViolations)
			}
			if NewReport(cfg, res, nil).OK == tc.violations {
				t.Fatal("the report's verdict does not follow the violations")
			}
		})
	}
}

// A redirect is not followed: the buyers' requests stay with the URL given,
// and what another host answers is not counted.
func TestStormDoesNotFollowRedirects(t *testing.T) {
	f := newFakeAPI(100)
	other := httptest.NewServer(f.handler())
	defer other.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirect.Close()
	cfg := baseConfig(redirect.URL)
	cfg.Buyers = 20
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := f.requests.Load(); n != 0 || len(res.Acked) != 0 || res.Outcomes[OpReserve]["307"] != 20 {
		t.Fatalf("%d requests reached the other host; acked %v; outcomes %v", n, res.Acked, res.Outcomes)
	}
	rep := NewReport(cfg, res, nil)
	if rep.OK || len(rep.Failures) != 1 || !strings.Contains(rep.Failures[0], "no reservation request reached the sale") {
		t.Fatalf("report %+v", rep.Failures)
	}
}

// A storm that never reached the sale (a wrong SKU or key: every answer 4xx)
// fails, however clean its audit; a sold-out sale did answer.
func TestReportFailsWhenNoRequestReachedTheSale(t *testing.T) {
	f := newFakeAPI(100)
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	cfg := baseConfig(srv.URL)
	cfg.Buyers, cfg.SKU = 20, "sku-typo"
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep := NewReport(cfg, res, nil); rep.OK || res.Verdicts() != 0 {
		t.Fatalf("outcomes %v: report OK %v", res.Outcomes, rep.OK)
	}
	soldOut := newFakeAPI(0)
	srv2 := httptest.NewServer(soldOut.handler())
	defer srv2.Close()
	cfg = baseConfig(srv2.URL)
	cfg.Buyers = 20
	if res, err = Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if rep := NewReport(cfg, res, nil); !rep.OK || res.Verdicts() < 20 {
		t.Fatalf("a sold-out sale answered: outcomes %v, failures %v", res.Outcomes, rep.Failures)
	}
}

// A dead replica: its buyers move to the live one; nothing is lost.
func TestStormFailsOverToTheNextURL(t *testing.T) {
	f := newFakeAPI(100)
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	// A port from the harness's reserved range: nothing else binds it while
	// the test runs, as an ephemeral port closed again could be.
	port, err := testharness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("http://127.0.0.1:%d", port)
	cfg := baseConfig(dead, srv.URL)
	cfg.Buyers, cfg.RetryRatio, cfg.CheckoutRatio, cfg.CancelRatio, cfg.AbandonRatio = 300, 0, 1, 0, 0
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcomes[OpReserve]["ERR refused"] != 150 {
		t.Fatalf("outcomes %v: want 150 refused first attempts", res.Outcomes)
	}
	if len(res.Acked) != 100 || len(res.Confirmed) != 100 {
		t.Fatalf("acked %d confirmed %d, want 100 each", len(res.Acked), len(res.Confirmed))
	}
}

// A lost answer is retried with the same idempotency key; the replay (200)
// is the acknowledgement.
func TestStormRetriesLostAnswersAndBusy(t *testing.T) {
	f := newFakeAPI(50)
	f.dropResponses.Store(10)
	f.busyFirst = true
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	cfg := baseConfig(srv.URL)
	cfg.Buyers, cfg.RetryRatio = 100, 0
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %s: the backoff is not capped", d)
	}
	out := res.Outcomes[OpReserve]
	if out["503 UNAVAILABLE"] != 100 {
		t.Fatalf("outcomes %v", out)
	}
	if out["ERR eof"] == 0 && out["ERR reset"] == 0 && out["ERR other"] == 0 {
		t.Fatalf("no lost answer counted: %v", out)
	}
	f.mu.Lock()
	issued := len(f.issued)
	f.mu.Unlock()
	if len(res.Acked) != issued || issued < 50 { // cancelled units are sold again
		t.Fatalf("acked %d, issued %d", len(res.Acked), issued)
	}
}

func TestStormStopsAtDurationAndOnCancel(t *testing.T) {
	f := newFakeAPI(1 << 30)
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	cfg := baseConfig(srv.URL)
	cfg.Buyers, cfg.Duration = 1<<20, 150*time.Millisecond
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second || res.Journeys == 0 || res.Journeys >= 1<<20 || res.Interrupted {
		t.Fatalf("duration-bound run: %d journeys in %s, interrupted %v", res.Journeys, d, res.Interrupted)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	cfg.Duration = 0
	cfg.Count = 1 << 20
	res, err = Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Journeys == 0 || res.Journeys >= 1<<20 || !res.Interrupted {
		t.Fatalf("cancelled run: %d journeys, interrupted %v", res.Journeys, res.Interrupted)
	}
	if rep := NewReport(cfg, res, nil); rep.OK || !strings.Contains(strings.Join(rep.Failures, ";"), "interrupted") {
		t.Fatalf("an interrupted run's report: %+v", rep.Failures)
	}
	if n := res.Outcomes[OpReserve]["ERR cancelled"]; n != 0 {
		t.Fatalf("%d requests cut by the stop", n)
	}
}

func TestStormChoicesFollowTheSeed(t *testing.T) {
	runOnce := func(seed uint64, concurrency int) *Result {
		f := newFakeAPI(1 << 20)
		srv := httptest.NewServer(f.handler())
		defer srv.Close()
		cfg := baseConfig(srv.URL)
		cfg.Buyers, cfg.Seed, cfg.Concurrency = 500, seed, concurrency
		res, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b, other := runOnce(3, 4), runOnce(3, 32), runOnce(4, 4)
	shape := func(r *Result) string {
		return fmt.Sprintf("retries %d confirmed %d cancelled %d abandoned %d",
			sum(r.Outcomes[OpRetry]), len(r.Confirmed), len(r.Cancelled), r.Abandoned)
	}
	if shape(a) != shape(b) {
		t.Fatalf("same seed, different choices: %s vs %s", shape(a), shape(b))
	}
	if shape(a) == shape(other) {
		t.Fatalf("another seed made the same choices: %s", shape(a))
	}
}

// A retry is judged by the attempt that answered it: one sent after the first
// answer's expiry may find the reservation swept, even when an earlier
// attempt of the same retry went out before.
func TestReplayViolationTimesTheAnsweringAttempt(t *testing.T) {
	now := time.Now()
	first := answer{status: 201, reservationID: "1.k", expiresAt: now.Add(10 * time.Second)}
	for _, tc := range []struct {
		name   string
		again  answer
		broken bool
	}{
		{"replayed", answer{status: 200, reservationID: "1.k", sentAt: now}, false},
		{"another id", answer{status: 200, reservationID: "2.k", sentAt: now}, true},
		{"201 while held", answer{status: 201, reservationID: "1.k", sentAt: now}, true},
		{"limit while held", answer{status: 409, code: "LIMIT_EXCEEDED", sentAt: now}, true},
		{"expired while held", answer{status: 410, code: "EXPIRED", sentAt: now}, true},
		{"expired, sent after the expiry", answer{status: 410, code: "EXPIRED", sentAt: now.Add(11 * time.Second)}, false},
		{"busy", answer{status: 503, code: "UNAVAILABLE", sentAt: now}, false},
		{"ended", answer{status: 410, code: "ENDED", sentAt: now}, false},
		{"rate limited", answer{status: 429, code: "RATE_LIMITED", sentAt: now}, false},
	} {
		if got := replayViolation(first, tc.again) != ""; got != tc.broken {
			t.Errorf("%s: violation %v, want %v", tc.name, got, tc.broken)
		}
	}
	if v := replayViolation(answer{status: 503}, answer{status: 201, reservationID: "1.k", sentAt: now}); v != "" {
		t.Errorf("a retry of an unacknowledged request may reserve: %s", v)
	}
}
