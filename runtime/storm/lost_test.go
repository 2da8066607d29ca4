package storm

import (
	"cmp"
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// Buyers who lose their answers find their reservations in their lists and
// pay for them or cancel them as the others do.
func TestStormFindsLostAnswersInTheBuyersList(t *testing.T) {
	f := newFakeAPI(300)
	f.expiresIn = time.Minute
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	cfg := baseConfig(srv.URL)
	cfg.LoseRatio = 0.5
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	lists := res.Outcomes[OpList]["200"]
	if len(res.ListViolations) != 0 || res.Recovered == 0 || res.Recovered != lists {
		t.Fatalf("recovered %d of %d lists; violations %v", res.Recovered, lists, res.ListViolations)
	}
	// About half the acknowledged reservations, loosely.
	if acked := int64(len(res.Acked)); res.Recovered < acked/4 || res.Recovered > 3*acked/4 {
		t.Fatalf("recovered %d of %d acknowledged reservations for a ratio of 0.5", res.Recovered, acked)
	}
	if paid := f.with("paid"); !slices.Equal(res.Confirmed, paid) || len(paid) == 0 {
		t.Fatalf("confirmed %d, the server has %d paid", len(res.Confirmed), len(paid))
	}
	if got := int64(len(res.Confirmed)+len(res.Cancelled)) + res.Abandoned; got != int64(len(res.Acked)) {
		t.Fatalf("confirmed+cancelled+abandoned = %d, acked %d", got, len(res.Acked))
	}
	if r := NewReport(cfg, res, nil); !r.OK || r.Recovered != res.Recovered {
		t.Fatalf("report ok %v, recovered %d", r.OK, r.Recovered)
	}
}

// A list that leaves out a held reservation, or shows it otherwise than it
// was answered, is a violation, and the report fails; a list the server
// could not give (503) is no verdict: the buyer walks away.
func TestStormChecksTheBuyersList(t *testing.T) {
	for _, c := range []struct {
		name      string
		expiresIn time.Duration // of the reservation, as answered; 0: a minute
		spoil     func(f *fakeAPI, id string)
		want      string
	}{
		{"left out", 0, func(f *fakeAPI, id string) { f.unlisted[id] = true }, "is not in the list of 0 reservations"},
		{"another expiry", 0, func(f *fakeAPI, id string) { f.expiry[id] = f.expiry[id].Add(time.Second) }, "listed reserved for 1 until"},
		{"not served", 0, func(f *fakeAPI, _ string) { f.listBusy = true }, ""},
		// Released by the sweeper before the list was read: no longer listed.
		{"lapsed", -2 * time.Second, func(f *fakeAPI, id string) { f.unlisted[id] = true }, ""},
		// Held when the list was sent, released by the time it was read.
		{"lapsed while listed", 1500 * time.Millisecond, func(f *fakeAPI, id string) {
			f.listDelay = time.Second
			f.unlisted[id] = true
		}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeAPI(10)
			f.expiresIn = cmp.Or(c.expiresIn, time.Minute)
			srv := httptest.NewServer(breakAfterReserve(f, func(id string) { c.spoil(f, id) }))
			defer srv.Close()
			cfg := baseConfig(srv.URL)
			cfg.Buyers, cfg.Count, cfg.Concurrency, cfg.RetryRatio = 1, 1, 1, 0
			cfg.CheckoutRatio, cfg.CancelRatio, cfg.AbandonRatio, cfg.LoseRatio = 1, 0, 0, 1
			cfg.Sleep = func(ctx context.Context, d time.Duration) {}
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := NewReport(cfg, res, nil)
			if c.want == "" {
				if len(res.ListViolations) != 0 || !r.OK || res.Abandoned != 1 || len(res.Confirmed) != 0 {
					t.Fatalf("violations %v, ok %v, abandoned %d, confirmed %d; want the buyer to walk away", res.ListViolations, r.OK, res.Abandoned, len(res.Confirmed))
				}
				return
			}
			if len(res.ListViolations) != 1 || !strings.Contains(res.ListViolations[0], c.want) || r.OK || len(res.Confirmed) != 0 {
				t.Fatalf("violations %q, report ok %v, confirmed %d; want one with %q", res.ListViolations, r.OK, len(res.Confirmed), c.want)
			}
		})
	}
}

// breakAfterReserve serves f, and once a reservation is made calls brk with
// its id before the answer leaves (net/http sends a small answer when the
// handler returns), so the buyer's list is broken before it asks.
func breakAfterReserve(f *fakeAPI, brk func(id string)) http.Handler {
	next := f.handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if r.Method == http.MethodPost && r.URL.Path == reservePath {
			f.mu.Lock()
			defer f.mu.Unlock()
			if n := len(f.issued); n > 0 {
				brk(f.issued[n-1])
			}
		}
	})
}

// Two storms with the same buyers (one --user-prefix) are two sets of
// requests: the second one's keys are new, so none of its reservations is a
// replay of the first one's, and the buyers' lists show what each was
// answered.
func TestStormsSharingBuyersDoNotReplayEachOther(t *testing.T) {
	f := newFakeAPI(4000)
	f.expiresIn = time.Minute
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	cfg := baseConfig(srv.URL)
	cfg.LoseRatio = 0.5
	first, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r := NewReport(cfg, second, nil); !r.OK || len(second.ListViolations) != 0 || len(second.IdempotencyViolations) != 0 {
		t.Fatalf("the second storm with the same buyers: ok %v, %d idempotency and %d list violations, first %q",
			r.OK, len(second.IdempotencyViolations), len(second.ListViolations), firstOf(second.IdempotencyViolations, second.ListViolations))
	}
	if got := second.Outcomes[OpReserve]["200"]; got != 0 {
		t.Fatalf("the second storm's first attempts were answered as replays %d times", got)
	}
	for _, id := range second.Acked {
		if slices.Contains(first.Acked, id) {
			t.Fatalf("reservation %s acknowledged to both storms", id)
		}
	}
}

func firstOf(lists ...[]string) string {
	for _, l := range lists {
		if len(l) > 0 {
			return l[0]
		}
	}
	return ""
}
