package api

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func withMaxInFlight(n int) option { return func(c *fixtureConfig) { c.api.MaxInFlight = n } }

// Past MaxInFlight buyer requests doing their Redis and ledger work, the next
// is answered 503 at once, touching nothing, while the probes and the
// availability route still answer; the requests in progress finish, and their
// places are free again. The work is held where it lands every run: the
// ledger's batch waits on the campaign row, locked as a rebuild locks it.
func TestOverloadIsRefusedAtOnce(t *testing.T) {
	f := newFixture(t, withMaxInFlight(2))
	ctx := context.Background()
	tx, err := f.l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
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

	redisBefore := f.redisCmds.Load()
	refused := []response{
		f.call(http.MethodPost, reservePath, f.token("third"), reserveBody("third", "k", 1)),
		f.checkout("third", "0.AAAAAAAAAAAAAAAAAAAAAAAA", "pay"),
		f.call(http.MethodDelete, cancelPath("0.AAAAAAAAAAAAAAAAAAAAAAAA"), f.token("third"), nil),
	}
	for i, r := range refused {
		e := r.errorBody(t)
		if r.status != http.StatusServiceUnavailable || e.Code != CodeUnavailable || !strings.Contains(e.Message, "overloaded") || r.header.Get("Retry-After") != "1" {
			t.Fatalf("request %d past the bound: %d %s, Retry-After %q", i, r.status, r.body, r.header.Get("Retry-After"))
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
	if got := testutil.ToFloat64(f.srv.metrics.shed); got != 3 {
		t.Fatalf("flashsale_api_shed_total %v, want 3", got)
	}
	gauges := f.srv.inFlightGauges()
	if got := testutil.ToFloat64(gauges[0]); got != 2 {
		t.Fatalf("flashsale_api_in_flight %v, want 2", got)
	}
	if got := testutil.ToFloat64(gauges[1]); got != 2 {
		t.Fatalf("flashsale_api_in_flight_limit %v, want 2", got)
	}

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if r := <-held; r.status != http.StatusCreated {
			t.Fatalf("a request in progress: %d %s", r.status, r.body)
		}
	}
	if r := f.call(http.MethodPost, reservePath, f.token("third"), reserveBody("third", "k", 1)); r.status != http.StatusCreated {
		t.Fatalf("after the overload: %d %s", r.status, r.body)
	}
	if n := f.srv.inFlight.n.Load(); n != 0 {
		t.Fatalf("%d requests in flight after every answer", n)
	}
	if c := f.assertConserved(); c.Reserved != 3 {
		t.Fatalf("counts %+v, want 3 reserved", c)
	}
}

// A negative bound is none; zero takes the default.
func TestMaxInFlightDefaults(t *testing.T) {
	f := newFixture(t)
	if f.srv.inFlight.max != DefaultMaxInFlight || f.srv.inFlight.limit.Load() != minInFlight || f.srv.inFlight.wait != DefaultRequestTimeout/2 {
		t.Fatalf("default ceiling %d, bound %d, wait %v", f.srv.inFlight.max, f.srv.inFlight.limit.Load(), f.srv.inFlight.wait)
	}
	g := newFixture(t, withMaxInFlight(-1))
	for range 3 {
		if _, ok := g.srv.inFlight.enter(); !ok {
			t.Fatal("refused without a bound")
		}
	}
}

// The bound follows what the process served in the last sample, per second,
// times wait (half the deadline; 1 s here): a process that serves 10,000
// requests a second admits 10,000 at once. Held between samples; it falls a
// quarter a sample at most, not at all while the requests in flight stay
// well under it (the rate then measured the demand), and requests that
// took longer than wait (timeouts behind a stall) are not served.
func TestInFlightBoundFollowsTheRate(t *testing.T) {
	clock := time.Unix(1_700_000_000, 0)
	var f inFlight
	f.init(16384, time.Second, func() time.Time { return clock })
	var started []int64 // of the requests in flight, oldest first
	admit := func(n int) int {
		got := 0
		for range n {
			if at, ok := f.enter(); ok {
				started = append(started, at)
				got++
			}
		}
		return got
	}
	finish := func(n int) {
		for _, at := range started[:n] {
			f.leave(at)
		}
		started = started[n:]
	}
	serve := func(n int) { // one at a time
		for range n {
			at, ok := f.enter()
			if !ok {
				t.Fatal("a request refused with none in flight")
			}
			f.leave(at)
		}
	}
	bound := func(want int64, what string) {
		t.Helper()
		if got := f.limit.Load(); got != want {
			t.Fatalf("%s: bound %d, want %d", what, got, want)
		}
	}
	if got := admit(minInFlight + 10); got != minInFlight {
		t.Fatalf("a new process admitted %d, want the floor %d", got, minInFlight)
	}
	// 2,500 served in a quarter second: 10,000 a second.
	finish(minInFlight)
	serve(2500 - minInFlight)
	clock = clock.Add(inFlightSample)
	if got := admit(12_000); got != 10_000 {
		t.Fatalf("at 10,000 a second it admitted %d at once, want 10000", got)
	}
	// Held until the next sample, however few finish meanwhile.
	finish(100)
	clock = clock.Add(inFlightSample / 2)
	if got := admit(200); got != 100 {
		t.Fatalf("between samples it admitted %d, want the 100 places freed", got)
	}
	// 100 served in a quarter second with the bound full: a quarter less.
	clock = clock.Add(inFlightSample / 2)
	if admit(1) != 0 {
		t.Fatal("admitted past a bound below the requests in flight")
	}
	bound(7500, "100 served in a sample, 10,000 in flight")
	// 5,000 served in 0.4 s: 12,500 a second (the sample's own length).
	finish(5000)
	clock = clock.Add(400 * time.Millisecond)
	admit(1)
	bound(12_500, "5,000 served in 0.4 s")
	// Few in flight and none served (those in flight time out): the demand
	// fell, the bound stays.
	clock = clock.Add(2 * time.Second)
	finish(len(started))
	clock = clock.Add(inFlightSample)
	admit(1)
	bound(12_500, "a quiet sample")
	serve(2500) // 10,000 a second, one at a time
	clock = clock.Add(inFlightSample)
	admit(1)
	bound(12_500, "10,000 a second served with 2 in flight")
	// A stall: the bound's requests time out together; they were not
	// served, so the bound falls instead of rising.
	finish(len(started))
	admit(12_500)
	clock = clock.Add(5 * time.Second)
	admit(1)
	bound(9375, "nothing served in 5 s")
	finish(12_000)
	clock = clock.Add(inFlightSample)
	admit(1)
	bound(7031, "12,000 timeouts in a sample")
	// A ceiling below the floor is the bound.
	var small inFlight
	small.init(2, time.Second, func() time.Time { return clock })
	clock = clock.Add(time.Hour)
	_, ok1 := small.enter()
	_, ok2 := small.enter()
	if _, ok3 := small.enter(); !ok1 || !ok2 || ok3 {
		t.Fatal("a ceiling of 2 did not admit exactly 2")
	}
}
