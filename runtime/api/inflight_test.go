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
	if got := testutil.ToFloat64(f.srv.inFlightGauge()); got != 2 {
		t.Fatalf("flashsale_api_in_flight %v, want 2", got)
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
	if f.srv.inFlight.max != DefaultMaxInFlight {
		t.Fatalf("default bound %d", f.srv.inFlight.max)
	}
	g := newFixture(t, withMaxInFlight(-1))
	for range 3 {
		if !g.srv.inFlight.enter() {
			t.Fatal("refused without a bound")
		}
	}
}
