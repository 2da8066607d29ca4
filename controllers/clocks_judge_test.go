package controllers

import (
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// judgeClocks: the bound is the smaller of 1s and a tenth of the TTL, a
// difference counts only beyond the measurement's uncertainty, clocks found
// apart are in step again within half the bound, and the message's figure
// does not follow each reading's jitter.
func TestJudgeClocks(t *testing.T) {
	const srv = "10.0.0.7:6379"
	for _, c := range []struct {
		name   string
		skew   engine.ClockSkew
		ttl    time.Duration
		apart  bool // found apart before
		inStep bool
		says   string
	}{
		{"in step", engine.ClockSkew{Server: srv, Ahead: 3 * time.Millisecond, Uncertainty: time.Millisecond}, 10 * time.Minute, false, true, "agree within 1s"},
		{"under a second, a long TTL", engine.ClockSkew{Server: srv, Ahead: 900 * time.Millisecond}, 10 * time.Minute, false, true, "within 1s"},
		{"ledger ahead", engine.ClockSkew{Server: srv, Ahead: 5012 * time.Millisecond, Uncertainty: time.Millisecond}, 10 * time.Minute, false, false,
			"PostgreSQL's clock is 5s ahead of Redis 10.0.0.7:6379's (bound 1s): every reservation (reservation.ttl 10m0s) has 5s less to be paid"},
		{"ledger behind", engine.ClockSkew{Server: srv, Ahead: -2340 * time.Millisecond}, 10 * time.Minute, false, false,
			"PostgreSQL's clock is 2.3s behind Redis 10.0.0.7:6379's (bound 1s): expired reservations are given back to the stock 2.3s late"},
		{"a short TTL tolerates less", engine.ClockSkew{Server: srv, Ahead: 150 * time.Millisecond, Uncertainty: 10 * time.Millisecond}, time.Second, false, false,
			"150ms ahead of Redis 10.0.0.7:6379's (bound 100ms)"},
		{"within the uncertainty", engine.ClockSkew{Server: srv, Ahead: 150 * time.Millisecond, Uncertainty: 60 * time.Millisecond}, time.Second, false, true,
			"agree within 100ms"},
		{"apart before, not yet back within half the bound", engine.ClockSkew{Server: srv, Ahead: 700 * time.Millisecond}, 10 * time.Minute, true, false,
			"700ms ahead"},
		{"apart before, back within half the bound", engine.ClockSkew{Server: srv, Ahead: 400 * time.Millisecond}, 10 * time.Minute, true, true,
			"agree within 1s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := judgeClocks(c.skew, c.ttl, c.apart)
			if v.inStep != c.inStep || !strings.Contains(v.message, c.says) {
				t.Fatalf("%+v, TTL %s: in step %v, %q; want %v, saying %q", c.skew, c.ttl, v.inStep, v.message, c.inStep, c.says)
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
