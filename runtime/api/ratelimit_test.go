package api

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

func TestRateLimit(t *testing.T) {
	f := newFixture(t, withRateLimit(1, 2))
	ask := func(user string) response {
		return f.checkout(user, "0.AAAAAAAAAAAAAAAAAAAAAAAA", "pay")
	}
	for range 2 {
		if r := ask("eager"); r.status != http.StatusNotFound {
			t.Fatalf("within the burst: %d %s", r.status, r.body)
		}
	}
	before := f.redisCmds.Load()
	r := ask("eager")
	if e := r.errorBody(t); r.status != http.StatusTooManyRequests || e.Code != CodeRateLimited {
		t.Fatalf("over the limit: %d %s", r.status, r.body)
	}
	if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 || s > 2 {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	if f.redisCmds.Load() != before {
		t.Fatal("a rate-limited request reached Redis")
	}
	// Other buyers are not affected; the eager one is back after a second.
	if r := ask("patient"); r.status != http.StatusNotFound {
		t.Fatalf("another user: %d %s", r.status, r.body)
	}
	time.Sleep(1100 * time.Millisecond)
	if r := ask("eager"); r.status != http.StatusNotFound {
		t.Fatalf("after refill: %d %s", r.status, r.body)
	}
}
func TestLimiter(t *testing.T) {
	l := newLimiter(10, 3)
	now := time.Unix(1000, 0)
	for i := range 3 {
		if ok, _ := l.allow("a", now); !ok {
			t.Fatalf("request %d within the burst refused", i)
		}
	}
	ok, wait := l.allow("a", now)
	if ok || wait != 100*time.Millisecond {
		t.Fatalf("over the burst: %v, wait %s", ok, wait)
	}
	if ok, _ := l.allow("a", now.Add(100*time.Millisecond)); !ok {
		t.Fatal("one token refilled after 1/rate")
	}
	// Idle users are forgotten as new ones arrive.
	for i := range 10 * sweepEvery * limiterShards / 8 {
		l.allow("user-"+strconv.Itoa(i), now.Add(time.Duration(i)*time.Millisecond))
	}
	if n := l.size(); n > 2*sweepEvery*limiterShards {
		t.Fatalf("%d buckets kept", n)
	}
	if newLimiter(0, 5) != nil {
		t.Fatal("rate 0 must disable the limit")
	}
	var off *limiter
	if ok, _ := off.allow("x", now); !ok {
		t.Fatal("a disabled limiter refused")
	}
}
