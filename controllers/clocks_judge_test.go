package controllers

import (
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// judgeClocks: the bound is the smaller of 1s and a tenth of the TTL; a
// reading is apart only beyond its uncertainty and in step only within it,
// and tells nothing in between; clocks found apart are in step again within
// half the bound; the message's figure does not follow each reading's jitter.
func TestJudgeClocks(t *testing.T) {
	const srv = "10.0.0.7:6379"
	const unknown = "(no verdict)"
	for _, c := range []struct {
		name  string
		skew  engine.ClockSkew
		ttl   time.Duration
		apart bool // found apart before
		says  string
	}{
		{"in step", engine.ClockSkew{Server: srv, Ahead: 3 * time.Millisecond, Uncertainty: time.Millisecond}, 10 * time.Minute, false,
			"in step: PostgreSQL's clock and the Redis servers' agree within 1s"},
		{"under a second, a long TTL", engine.ClockSkew{Server: srv, Ahead: 900 * time.Millisecond}, 10 * time.Minute, false, "in step"},
		{"ledger ahead", engine.ClockSkew{Server: srv, Ahead: 5012 * time.Millisecond, Uncertainty: time.Millisecond}, 10 * time.Minute, false,
			"apart: PostgreSQL's clock is 5s ahead of Redis 10.0.0.7:6379's (this sale tolerates 1s, and counts them in step again under 500ms): every reservation (reservation.ttl 10m0s) has 5s less to be paid"},
		{"ledger behind", engine.ClockSkew{Server: srv, Ahead: -2340 * time.Millisecond}, 10 * time.Minute, false,
			"apart: PostgreSQL's clock is 2.3s behind Redis 10.0.0.7:6379's (this sale tolerates 1s, and counts them in step again under 500ms): expired reservations are given back to the stock 2.3s late"},
		{"a short TTL tolerates less", engine.ClockSkew{Server: srv, Ahead: 150 * time.Millisecond, Uncertainty: 10 * time.Millisecond}, time.Second, false,
			"apart: PostgreSQL's clock is 150ms ahead of Redis 10.0.0.7:6379's (this sale tolerates 100ms"},
		{"apart or not, the reading cannot tell", engine.ClockSkew{Server: srv, Ahead: 150 * time.Millisecond, Uncertainty: 60 * time.Millisecond}, time.Second, false,
			unknown},
		{"a slow round trip says nothing", engine.ClockSkew{Server: srv, Ahead: 2 * time.Second, Uncertainty: 1500 * time.Millisecond}, 10 * time.Minute, false,
			unknown},
		{"apart before, not yet back within half the bound", engine.ClockSkew{Server: srv, Ahead: 700 * time.Millisecond}, 10 * time.Minute, true,
			"apart: PostgreSQL's clock is 700ms ahead"},
		{"apart before, back within half the bound", engine.ClockSkew{Server: srv, Ahead: 400 * time.Millisecond}, 10 * time.Minute, true,
			"in step"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := unknown
			if v := judgeClocks(c.skew, c.ttl, c.apart); v != nil && v.inStep {
				got = "in step: " + v.message
			} else if v != nil {
				got = "apart: " + v.message
			}
			if !strings.HasPrefix(got, c.says) {
				t.Fatalf("%+v, TTL %s, apart before %v: %q; want %q", c.skew, c.ttl, c.apart, got, c.says)
			}
		})
	}
	// Readings a few milliseconds apart write the same message.
	a := judgeClocks(engine.ClockSkew{Server: srv, Ahead: 5012 * time.Millisecond}, time.Minute, false)
	b := judgeClocks(engine.ClockSkew{Server: srv, Ahead: 4987 * time.Millisecond}, time.Minute, true)
	if a.message != b.message {
		t.Fatalf("jitter changes the message: %q, %q", a.message, b.message)
	}
}
