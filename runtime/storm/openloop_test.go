package storm

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

func TestScheduleAt(t *testing.T) {
	start := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		rate float64
		j    int64
		want time.Duration
	}{
		{1000, 0, 0},
		{1000, 1, time.Millisecond},
		{3, 3, time.Second},            // 1/3 s steps land exactly on the second
		{3, 1, 333333333},              // rounded to the nanosecond
		{1000, 1e9, 1e6 * time.Second}, // computed from j: no drift after a billion steps
		{7000, 7e8, 1e5 * time.Second},
	} {
		if got := scheduleAt(start, c.rate, c.j).Sub(start); got != c.want {
			t.Errorf("scheduleAt(rate %v, j %d) = %v after start, want %v", c.rate, c.j, got, c.want)
		}
	}
}

func TestLatencyCountsFromTheDueTime(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, c := range []struct {
		name            string
		due, sent, done time.Time
		want            time.Duration
	}{
		{"closed loop: from the send", time.Time{}, at(5), at(8), 3 * time.Millisecond},
		{"sent late: the wait for a connection counts", at(2), at(5), at(8), 6 * time.Millisecond},
		{"sent on time", at(5), at(5), at(8), 3 * time.Millisecond},
		{"a due time after the send is not credited", at(7), at(5), at(8), 3 * time.Millisecond},
		{"a clock that went back: never negative", time.Time{}, at(8), at(5), 0},
	} {
		if got := latency(c.due, c.sent, c.done); got != c.want {
			t.Errorf("%s: latency = %v, want %v", c.name, got, c.want)
		}
	}
}

// fakeClock is a storm's clock that moves only when the server works (each
// request takes service of it) or the schedule sleeps, so the latencies are
// exact, whatever the machine's speed.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) Sleep(_ context.Context, d time.Duration) {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// serviceAPI answers every reservation with a new 201 after taking service
// of the storm's clock.
func serviceAPI(t *testing.T, clock *fakeClock, service time.Duration) string {
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		id := fmt.Sprintf("0.r%d", n)
		mu.Unlock()
		clock.advance(service)
		writeJSON(w, http.StatusCreated, map[string]string{"reservation_id": id, "status": "reserved",
			"expires_at": clock.Now().Add(time.Hour).Format(time.RFC3339Nano)})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func clockedConfig(url string, clock *fakeClock, rate float64, count int) Config {
	cfg := baseConfig(url)
	cfg.Buyers, cfg.Count, cfg.Concurrency, cfg.MaxAttempts = count, count, 1, 1
	cfg.RetryRatio, cfg.CheckoutRatio, cfg.CancelRatio, cfg.AbandonRatio = 0, 0, 0, 1
	cfg.Rate, cfg.Now, cfg.Sleep = rate, clock.Now, clock.Sleep
	return cfg
}

// A server slower than the schedule: 3 ms per request, one connection,
// journeys due every 2 ms. Journey j is due at 2j ms, sent at 3j ms (when
// the connection frees) and answered at 3j+3 ms: its latency is j+3 ms. The
// closed loop on the same server reports 3 ms for every request, and hides
// the queue (coordinated omission).
func TestOpenLoopLatencyIncludesTheQueue(t *testing.T) {
	const count = 10
	start := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

	open := &fakeClock{now: start}
	res, err := Run(context.Background(), clockedConfig(serviceAPI(t, open, 3*time.Millisecond), open, 500, count))
	if err != nil {
		t.Fatal(err)
	}
	l := res.Latency[OpReserve]
	if l.Count != count || l.Max != (count-1+3)*time.Millisecond {
		t.Errorf("open loop: %d answers, max %v; want %d, %v", l.Count, l.Max, count, (count-1+3)*time.Millisecond)
	}
	// Nearest rank over 3..12 ms: p50 is the 5th (7 ms), p99 the 10th (12 ms);
	// the histogram reports its bucket's top, within 3%.
	near := func(name string, got, want time.Duration) {
		t.Helper()
		if math.Abs(float64(got-want)) > 0.03*float64(want) || got < want {
			t.Errorf("open loop %s = %v, want %v (to 3%% above)", name, got, want)
		}
	}
	near("p50", l.P50, 7*time.Millisecond)
	near("p99", l.P99, 12*time.Millisecond)
	if len(open.sleeps) != 0 {
		t.Errorf("behind schedule the storm never waits; it slept %v", open.sleeps)
	}
	if res.Elapsed != count*3*time.Millisecond {
		t.Errorf("elapsed %v, want %v", res.Elapsed, count*3*time.Millisecond)
	}

	closed := &fakeClock{now: start}
	res, err = Run(context.Background(), clockedConfig(serviceAPI(t, closed, 3*time.Millisecond), closed, 0, count))
	if err != nil {
		t.Fatal(err)
	}
	if l := res.Latency[OpReserve]; l.Count != count || l.Max != 3*time.Millisecond || l.P99 > 3*time.Millisecond {
		t.Errorf("closed loop: %+v, want every request at 3 ms", l)
	}
}

// A server faster than the schedule: 1 ms per request, journeys due every
// 2 ms. The storm waits 1 ms before each journey after the first and every
// latency is the service time.
func TestOpenLoopKeepsTheSchedule(t *testing.T) {
	const count = 10
	clock := &fakeClock{now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	res, err := Run(context.Background(), clockedConfig(serviceAPI(t, clock, time.Millisecond), clock, 500, count))
	if err != nil {
		t.Fatal(err)
	}
	if l := res.Latency[OpReserve]; l.Count != count || l.Max != time.Millisecond {
		t.Errorf("latency %+v, want %d answers of 1 ms", l, count)
	}
	if len(clock.sleeps) != count-1 {
		t.Fatalf("slept %v, want %d waits of 1 ms", clock.sleeps, count-1)
	}
	for _, d := range clock.sleeps {
		if d != time.Millisecond {
			t.Errorf("slept %v, want 1ms each", clock.sleeps)
			break
		}
	}
	// The last journey is due at 18 ms and answered at 19 ms.
	if res.Elapsed != 19*time.Millisecond {
		t.Errorf("elapsed %v, want 19ms", res.Elapsed)
	}
}

// Journeys due at or after the end of the duration are never sent.
func TestOpenLoopStopsAtTheDuration(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	cfg := clockedConfig(serviceAPI(t, clock, time.Millisecond), clock, 1000, 0)
	cfg.Buyers, cfg.Count, cfg.Duration = 1000, 0, 10*time.Millisecond
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Due at 0, 1, ..., 9 ms; each answered 1 ms later, so never late.
	if res.Journeys != 10 || res.Latency[OpReserve].Max != time.Millisecond {
		t.Errorf("%d journeys (latency %+v), want 10 of 1 ms", res.Journeys, res.Latency[OpReserve])
	}
}

// Behind schedule at the end of the duration, every journey due before the
// end is still sent, late, and its lateness counted: 3 ms per request,
// journeys due every 2 ms, 10 ms: due at 0, 2, 4, 6, 8 ms, sent at 0, 3, 6,
// 9, 12 ms; the last is answered at 15 ms, 7 ms after its due time.
func TestOpenLoopSendsEveryJourneyDueBeforeTheEnd(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	cfg := clockedConfig(serviceAPI(t, clock, 3*time.Millisecond), clock, 500, 0)
	cfg.Buyers, cfg.Count, cfg.Duration = 1000, 0, 10*time.Millisecond
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if l := res.Latency[OpReserve]; res.Journeys != 5 || l.Max != 7*time.Millisecond {
		t.Errorf("%d journeys, latency %+v; want 5, the last 7 ms late", res.Journeys, l)
	}
}

// In the open loop a request gives one latency, from its due time to how it
// ended: a 503 and the backoff before its retry are what its buyer waited
// (3 ms, 25 ms, then 3 ms for the 201), and so is a request that ends in a
// transport error (5 ms, then the connection dropped).
func TestOpenLoopTimesEachRequestToItsEnd(t *testing.T) {
	start := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	t.Run("retried", func(t *testing.T) {
		clock := &fakeClock{now: start}
		var mu sync.Mutex
		n := 0
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			n++
			first := n%2 == 1
			mu.Unlock()
			clock.advance(3 * time.Millisecond)
			if first {
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"code": "UNAVAILABLE"})
				return
			}
			writeJSON(w, http.StatusCreated, map[string]string{"reservation_id": fmt.Sprintf("0.r%d", n), "status": "reserved",
				"expires_at": clock.Now().Add(time.Hour).Format(time.RFC3339Nano)})
		}))
		t.Cleanup(srv.Close)
		cfg := clockedConfig(srv.URL, clock, 10, 4) // due every 100 ms: never late
		cfg.MaxAttempts = 2
		res, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if l := res.Latency[OpReserve]; l.Count != 4 || l.Max != 31*time.Millisecond || l.P50 < 31*time.Millisecond {
			t.Errorf("latency %+v; want 4 requests of 31 ms each", l)
		}
	})
	t.Run("dropped", func(t *testing.T) {
		clock := &fakeClock{now: start}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			clock.advance(5 * time.Millisecond)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}))
		t.Cleanup(srv.Close)
		res, err := Run(context.Background(), clockedConfig(srv.URL, clock, 10, 3))
		if err != nil {
			t.Fatal(err)
		}
		if l := res.Latency[OpReserve]; l.Count != 3 || l.Max != 5*time.Millisecond {
			t.Errorf("latency %+v; want 3 requests of 5 ms each", l)
		}
	})
}

func TestRateValidation(t *testing.T) {
	for _, rate := range []float64{-1, math.NaN(), math.Inf(1), 2e6} {
		cfg := baseConfig("http://127.0.0.1:1")
		cfg.Rate = rate
		if err := cfg.Validate(); err == nil {
			t.Errorf("rate %v accepted", rate)
		}
	}
}
