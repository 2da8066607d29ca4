package e2e_test

import (
	"testing"
	"time"
)

// Redis loses everything in the middle of a storm: every shard refuses at
// once, the status says FailClosed, the controller rebuilds the stock from the
// ledger, the storm goes on, the audit is exact, and reservations acknowledged
// before the loss can still be paid for. test/node has the same case on a
// real node.
func TestRedisLostMidStormIsRebuiltFromTheLedger(t *testing.T) {
	t.Parallel()
	storms.Lock()
	defer storms.Unlock()
	// A Redis of its own, so that no other test's sale loses its data.
	rs, err := env.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	ns := namespaceName("redis-loss")
	newNamespace(t, ns, rs.Addr())
	s := applySale(t, ns, "redis-loss.yaml", nil)
	c := s.check()
	held := c.Hold(t, 5)
	phases := c.WatchPhases(t)

	st := s.startStorm(t, "--buyers", "100000", "--duration", "20s", "--concurrency", "16",
		"--checkout-ratio", "0.8", "--cancel-ratio", "0.2", "--settle", "60s")
	st.underway(t, s, 500)
	if err := rs.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	t.Log("Redis restarted empty")
	rebuiltAt := c.RebuiltAfterLoss(t, phases, held, 30*time.Second)
	c.SettledAfterRebuild(t, ledger, st.report(t), rebuiltAt, held)
}
