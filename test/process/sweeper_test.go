package process_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

const (
	metricLeader   = "flashsale_sweeper_leader"
	metricPassesOK = `flashsale_sweeper_passes_total{result="ok"}`
	metricReleased = `flashsale_sweeper_reservations_total{outcome="released"}`
)

func (c *campaign) startSweeper(name string) *process {
	// As the controller configures the sweeper pods: without the admission key.
	var env []string
	for _, kv := range c.env(config.EnvSweepInterval+"="+sweepInterval.String(), config.EnvLeaderLock+"="+config.LeaderLockPostgres) {
		if !strings.HasPrefix(kv, config.EnvAdmissionKey) {
			env = append(env, kv)
		}
	}
	p := c.start(name, env, "sweeper")
	p.waitReady(30 * time.Second)
	return p
}

// leaders reads every live sweeper's leader gauge and returns those at 1.
func leaders(t *testing.T, ps ...*process) []*process {
	t.Helper()
	var out []*process
	for _, p := range ps {
		if p.exited() {
			continue
		}
		m, err := p.metrics()
		if err != nil {
			t.Fatalf("%s metrics: %v", p.name, err)
		}
		if m[metricLeader] == 1 {
			out = append(out, p)
		}
	}
	return out
}

func metric(t *testing.T, p *process, name string) float64 {
	t.Helper()
	m, err := p.metrics()
	if err != nil {
		t.Fatalf("%s metrics: %v", p.name, err)
	}
	return m[name]
}

// Two sweepers: one leads and sweeps, the other never does; SIGKILL the
// leader and the other takes over and releases what expired; SIGTERM the new
// leader and it exits 0, handing over to a third at once.
func TestSweeperLeadership(t *testing.T) {
	c := newCampaign(t)
	a, b := c.startSweeper("sweeper-a"), c.startSweeper("sweeper-b")
	var leader *process
	testharness.Eventually(t, 10*time.Second, "one leader", func() bool {
		ls := leaders(t, a, b)
		if len(ls) > 1 {
			t.Fatal("two sweepers lead at once")
		}
		if len(ls) == 1 {
			leader = ls[0]
		}
		return leader != nil
	})
	follower := a
	if leader == a {
		follower = b
	}
	for range 10 {
		if ls := leaders(t, a, b); len(ls) != 1 || ls[0] != leader {
			t.Fatalf("leadership moved without a failure: %d leaders", len(ls))
		}
		time.Sleep(sweepInterval / 2)
	}
	if n := metric(t, leader, metricPassesOK); n < 2 {
		t.Fatalf("the leader made %v passes", n)
	}
	if n := metric(t, follower, metricPassesOK); n != 0 {
		t.Fatalf("the follower made %v passes", n)
	}

	// Reservations that expire after the leader is gone.
	ctx := context.Background()
	const held = 7
	for i := range held {
		r, err := c.eng.Reserve(ctx, fmt.Sprintf("walker-%d", i), "r", 1)
		if err != nil || r.Outcome != engine.OutcomeReserved {
			t.Fatalf("reserve: %v %v", r.Outcome, err)
		}
	}
	leader.kill()
	testharness.Eventually(t, 10*time.Second, "the follower to take over", func() bool {
		ls := leaders(t, follower)
		return len(ls) == 1
	})
	// The pass counts its releases once it ends, after they show in Redis.
	testharness.Eventually(t, ttl+grace+10*time.Second, "the new leader to release the expired units, and count them", func() bool {
		n := c.counts()
		return n.Reserved == 0 && n.Available == allocation && metric(t, follower, metricReleased) >= held
	})
	if n := metric(t, follower, metricReleased); n != held {
		t.Fatalf("the new leader released %v, want %d", n, held)
	}
	if n := c.counts(); n.Pending != 0 || !n.Conserved() || n.Oversold() != 0 {
		t.Fatalf("counts after the sweep %+v", n)
	}

	// SIGTERM: exit 0 and the lock is handed over at once, not at the
	// next failure detection.
	third := c.startSweeper("sweeper-c")
	if ls := leaders(t, third); len(ls) != 0 {
		t.Fatal("a third sweeper leads while another holds the lock")
	}
	if code := follower.terminate(15 * time.Second); code != 0 {
		t.Fatalf("sweeper exited %d after SIGTERM, want 0", code)
	}
	testharness.Eventually(t, 5*time.Second, "the third sweeper to take over", func() bool { return len(leaders(t, third)) == 1 })
}
