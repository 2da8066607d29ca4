package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func withMaxInFlight(n int) option { return func(c *fixtureConfig) { c.api.MaxInFlight = n } }
func withWorking(n int) option     { return func(c *fixtureConfig) { c.api.working = n } }

// With every place at work taken, the next buyer request waits in line,
// touching nothing; with the line full too (MaxInFlight taken in), the next is
// answered 503 at once, touching nothing, while the probes and the
// availability route still answer. The requests at work finish, the one in
// line takes a freed place and is served, and the places are free again. The
// work is held where it lands every run: the ledger's batch waits on the
// campaign row, locked as a rebuild locks it.
func TestOverloadWaitsInLineThenIsRefused(t *testing.T) {
	f := newFixture(t, withMaxInFlight(3), withWorking(2))
	tx, held := holdBothPlaces(t, f)
	ctx := context.Background()

	redisBefore := f.redisCmds.Load()
	waited := make(chan response, 1)
	go func() { waited <- f.call(http.MethodPost, reservePath, f.token("third"), reserveBody("third", "k", 1)) }()
	for deadline := time.Now().Add(20 * time.Second); f.srv.inFlight.waiting.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the third request never waited in line")
		}
	}
	refused := []response{
		f.call(http.MethodPost, reservePath, f.token("fourth"), reserveBody("fourth", "k", 1)),
		f.checkout("fourth", "0.AAAAAAAAAAAAAAAAAAAAAAAA", "pay"),
		f.call(http.MethodDelete, cancelPath("0.AAAAAAAAAAAAAAAAAAAAAAAA"), f.token("fourth"), nil),
	}
	for i, r := range refused {
		e := r.errorBody(t)
		if r.status != http.StatusServiceUnavailable || e.Code != CodeUnavailable || !strings.Contains(e.Message, "overloaded: 2 requests are in progress here and 1 wait") || r.header.Get("Retry-After") != "1" {
			t.Fatalf("request %d past a full line: %d %s, Retry-After %q", i, r.status, r.body, r.header.Get("Retry-After"))
		}
	}
	if n := f.redisCmds.Load(); n != redisBefore {
		t.Fatalf("refused requests sent %d Redis commands", n-redisBefore)
	}
	if r := f.call(http.MethodGet, "/healthz", "", nil); r.status != http.StatusOK {
		t.Fatalf("healthz while overloaded: %d %s", r.status, r.body)
	}
	if r := f.call(http.MethodGet, availabilityPath(testSKU), "", nil); r.status != http.StatusOK {
		t.Fatalf("availability while overloaded: %d %s", r.status, r.body)
	}
	if got := testutil.ToFloat64(f.srv.metrics.shed.WithLabelValues("line_full")); got != 3 {
		t.Fatalf("flashsale_api_shed_total{reason=\"line_full\"} %v, want 3", got)
	}
	gauges := f.srv.inFlightGauges()
	if got := testutil.ToFloat64(gauges[0]); got != 2 {
		t.Fatalf("flashsale_api_in_flight %v, want 2", got)
	}
	if got := testutil.ToFloat64(gauges[1]); got != 1 {
		t.Fatalf("flashsale_api_waiting %v, want 1", got)
	}

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if r := <-held; r.status != http.StatusCreated {
			t.Fatalf("a request in progress: %d %s", r.status, r.body)
		}
	}
	if r := <-waited; r.status != http.StatusCreated {
		t.Fatalf("the request in line: %d %s", r.status, r.body)
	}
	if r := f.call(http.MethodPost, reservePath, f.token("fourth"), reserveBody("fourth", "k", 1)); r.status != http.StatusCreated {
		t.Fatalf("after the overload: %d %s", r.status, r.body)
	}
	if n, w := f.srv.inFlight.n.Load(), f.srv.inFlight.waiting.Load(); n != 0 || w != 0 {
		t.Fatalf("%d requests at work and %d in line after every answer", n, w)
	}
	if c := f.assertConserved(); c.Reserved != 4 {
		t.Fatalf("counts %+v, want 4 reserved", c)
	}
}

// holdBothPlaces takes the fixture's two places with reservations whose
// ledger rows wait on the campaign row, locked as a rebuild locks it: the
// work is held where it lands every run, until the transaction ends.
func holdBothPlaces(t *testing.T, f *fixture) (pgx.Tx, chan response) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE`, f.e.Config().CampaignID); err != nil {
		t.Fatal(err)
	}
	base := f.redisCmds.Load()
	held := make(chan response, 2)
	for _, user := range []string{"first", "second"} {
		go func() { held <- f.call(http.MethodPost, reservePath, f.token(user), reserveBody(user, "k", 1)) }()
	}
	// Both are in flight and past Redis (one reserve call each, on a home
	// shard in stock): their rows wait for the lock.
	for deadline := time.Now().Add(20 * time.Second); f.srv.inFlight.n.Load() < 2 || f.redisCmds.Load() < base+2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests in flight and %d Redis commands, want 2 and 2", f.srv.inFlight.n.Load(), f.redisCmds.Load()-base)
		}
	}
	return tx, held
}

// A request in line whose wait (half the deadline) passes with the places
// still held is answered 503, having sent Redis nothing; the requests at
// work then finish within their own deadline.
func TestALineThatDoesNotMoveIsRefusedAfterTheWait(t *testing.T) {
	const timeout = 10 * time.Second
	// The held batch's own timeout well past the test's steps: the places
	// are freed by the rollback, never by it.
	f := newFixture(t, withMaxInFlight(3), withWorking(2), func(c *fixtureConfig) {
		c.api.RequestTimeout, c.mat.Timeout = timeout, time.Minute
	})
	tx, held := holdBothPlaces(t, f)
	redisBefore := f.redisCmds.Load()
	start := time.Now()
	r := f.call(http.MethodPost, reservePath, f.token("third"), reserveBody("third", "k", 1))
	if e := r.errorBody(t); r.status != http.StatusServiceUnavailable || e.Code != CodeUnavailable || r.header.Get("Retry-After") != "1" ||
		!strings.Contains(e.Message, "overloaded: no place among the 2 requests in progress here freed within 5s") {
		t.Fatalf("a request in a line that did not move: %d %s, Retry-After %q", r.status, r.body, r.header.Get("Retry-After"))
	}
	if d := time.Since(start); d < timeout/2 {
		t.Fatalf("refused after %v, before its wait of %v", d, timeout/2)
	}
	if n := f.redisCmds.Load(); n != redisBefore {
		t.Fatalf("the refused request sent %d Redis commands", n-redisBefore)
	}
	if got := testutil.ToFloat64(f.srv.metrics.shed.WithLabelValues("waited")); got != 1 {
		t.Fatalf(`flashsale_api_shed_total{reason="waited"} %v, want 1`, got)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if r := <-held; r.status != http.StatusCreated {
			t.Fatalf("a request at work: %d %s", r.status, r.body)
		}
	}
	if c := f.assertConserved(); c.Reserved != 2 {
		t.Fatalf("counts %+v, want 2 reserved", c)
	}
}

// A negative bound is none; zero takes the default; a bound below the places
// at work has no line.
func TestMaxInFlightDefaults(t *testing.T) {
	f := newFixture(t)
	if b := &f.srv.inFlight; cap(b.places) != DefaultWorking || b.lineMax != DefaultMaxInFlight-DefaultWorking || b.wait != DefaultRequestTimeout/2 {
		t.Fatalf("default places %d, line %d, wait %v", cap(b.places), b.lineMax, b.wait)
	}
	var none inFlight
	none.init(-1, DefaultWorking, time.Hour)
	for range 3 {
		if none.enter(bg) != admitted {
			t.Fatal("refused without a bound")
		}
	}
	var small inFlight
	small.init(2, DefaultWorking, time.Hour)
	if r := []int{small.enter(bg), small.enter(bg), small.enter(bg)}; r[0] != admitted || r[1] != admitted || r[2] != lineFull {
		t.Fatalf("a bound of 2 let in %v, want admitted, admitted, line full", r)
	}
}

// A request in line is refused when it waited wait, or at once when its
// client goes away; one past a full line is refused at once.
func TestTheLineWaitsAtMostWait(t *testing.T) {
	var f inFlight
	f.init(3, 1, 200*time.Millisecond)
	if f.enter(bg) != admitted {
		t.Fatal("the first request was not admitted")
	}
	start := time.Now()
	if got := f.enter(bg); got != waitedTooLong {
		t.Fatalf("with the place kept: %d, want waited too long", got)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("refused after %v, before the 200ms wait", d)
	}
	if got := f.enter(gone); got != clientGone {
		t.Fatalf("with the client gone: %d, want client gone", got)
	}
	f.wait = time.Hour
	stop, leave := context.WithCancel(bg)
	t.Cleanup(leave) // a failed test's waiters leave too
	out := make(chan int, 2)
	for range 2 {
		go func() { out <- f.enter(stop) }()
	}
	waitForSenders(t, 2)
	if got := f.enter(bg); got != lineFull {
		t.Fatalf("past a full line: %d, want line full", got)
	}
	leave()
	for range 2 {
		if got := <-out; got != clientGone {
			t.Fatalf("a waiter whose client went: %d", got)
		}
	}
	if n, w := f.n.Load(), f.waiting.Load(); n != 1 || w != 0 {
		t.Fatalf("%d at work and %d in line, want 1 and 0", n, w)
	}
}

// A place that frees goes to the request that waited longest, never to one
// that just came.
func TestTheLineIsFirstComeFirstServed(t *testing.T) {
	var f inFlight
	f.init(5, 1, time.Hour)
	if f.enter(bg) != admitted {
		t.Fatal("the first request was not admitted")
	}
	stop, leave := context.WithCancel(bg)
	t.Cleanup(leave) // a failed test's waiters leave
	order := make(chan int, 3)
	for i := range 3 {
		go func() {
			if f.enter(stop) == admitted {
				order <- i
			}
		}()
		waitForSenders(t, i+1) // each parked before the next comes
	}
	// A newcomer right after the place frees finds it taken by the first in
	// line: it would wait (and leaves at once, its client gone).
	for want := range 3 {
		f.leave()
		if got := f.enter(gone); got != clientGone {
			t.Fatalf("a newcomer as a place freed: %d, want to wait behind the line", got)
		}
		if got := <-order; got != want {
			t.Fatalf("a freed place went to waiter %d, want %d", got, want)
		}
	}
	f.leave()
	if f.enter(bg) != admitted {
		t.Fatal("a free place refused")
	}
}

// A request's deadline counts from before its wait in line, so that its
// answer stays within the request deadline.
func TestTheDeadlineCountsTheWait(t *testing.T) {
	f := newFixture(t, withMaxInFlight(2), withWorking(1))
	if f.srv.inFlight.enter(bg) != admitted {
		t.Fatal("the first request was not admitted")
	}
	type begun struct {
		ctx context.Context
		e   *apiError
	}
	out := make(chan begun, 1)
	var before time.Time
	go func() {
		r := httptest.NewRequest(http.MethodPost, reservePath, nil)
		before = time.Now()
		ctx, e := f.srv.begin(r)
		out <- begun{ctx, e}
	}()
	waitForSenders(t, 1)
	const wait = time.Second
	time.Sleep(wait)
	f.srv.end()
	b := <-out
	if b.e != nil {
		t.Fatalf("the request in line: %v", b.e)
	}
	defer f.srv.end()
	// Within wait/2 of the deadline taken when it began, a slow machine's
	// slack; a deadline taken after the wait is at least wait later.
	if d, ok := b.ctx.Deadline(); !ok || d.After(before.Add(DefaultRequestTimeout+deadlineSlot+wait/2)) {
		t.Fatalf("deadline %v after the request began, want about %v", d.Sub(before), DefaultRequestTimeout)
	}
}

// Each refusal of a request in line is counted by its reason and says why.
func TestARefusalInLineSaysWhy(t *testing.T) {
	f := newFixture(t, withMaxInFlight(2), withWorking(1), func(c *fixtureConfig) { c.api.RequestTimeout = 400 * time.Millisecond })
	if f.srv.inFlight.enter(bg) != admitted {
		t.Fatal("the first request was not admitted")
	}
	defer f.srv.end()
	req := httptest.NewRequest(http.MethodPost, reservePath, nil)
	if _, e := f.srv.begin(req); e == nil || e.status != http.StatusServiceUnavailable || !strings.Contains(e.message, "no place among the 1 requests in progress here freed within 200ms") {
		t.Fatalf("a request that waited: %+v", e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, e := f.srv.begin(req.WithContext(ctx)); e == nil || !strings.Contains(e.message, "the client went away") {
		t.Fatalf("a request whose client went: %+v", e)
	}
	for reason, want := range map[string]float64{"waited": 1, "client_gone": 1, "line_full": 0} {
		if got := testutil.ToFloat64(f.srv.metrics.shed.WithLabelValues(reason)); got != want {
			t.Fatalf("flashsale_api_shed_total{reason=%q} %v, want %v", reason, got, want)
		}
	}
}

// bg is a request context whose client stays; gone one whose client went.
var (
	bg   = context.Background()
	gone = func() context.Context { ctx, cancel := context.WithCancel(bg); cancel(); return ctx }()
)

// waitForSenders waits until n goroutines are parked sending on a channel in
// inFlight.enter: in line, not about to be.
func waitForSenders(t *testing.T, n int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		got := 0
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, "(*inFlight).enter") {
				got++
			}
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests parked in line, want %d", got, n)
		}
	}
}
