package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/podrunner"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// A reserve replica is SIGKILLed in the middle of a storm: the pod runner
// restarts it, and every reservation the storm was told about (201) is in the
// ledger.
func TestReserveReplicaKilledMidStormLosesNoAcknowledgement(t *testing.T) {
	t.Parallel()
	storms.Lock()
	defer storms.Unlock()
	ns := namespaceName("reserve-kill")
	newNamespace(t, ns, env.Redis.Addr())
	s := applySale(t, ns, "reserve-kill.yaml", nil)
	deploy := s.name + "-reserve"
	kubectl(t, nil, "rollout", "status", "-n", ns, "deployment/"+deploy, "--timeout=60s")

	ackedFile := filepath.Join(t.TempDir(), "acked")
	st := s.startStorm(t, "--buyers", "100000", "--duration", "8s", "--concurrency", "16",
		"--checkout-ratio", "0.5", "--cancel-ratio", "0.1", "--acked-file", ackedFile)
	st.underway(t, s, 200)
	before := runnerState(t).PodsOf(ns, deploy)
	if len(before) != 3 {
		t.Fatalf("the runner runs %d reserve replicas, want 3", len(before))
	}
	pid, err := env.RunnerAPI.Kill(context.Background(), ns, deploy, 0)
	if err != nil {
		t.Fatal(err)
	}
	if pid != before[0].PID {
		t.Fatalf("killed pid %d, the runner listed %d", pid, before[0].PID)
	}
	t.Logf("SIGKILLed %s (pid %d) mid-storm", before[0].Name, pid)

	eventually(t, 30*time.Second, 100*time.Millisecond, func() string {
		p := runnerState(t).PodsOf(ns, deploy)[0]
		if p.Restarts < 1 || !p.Ready || p.PID == pid || p.Name != before[0].Name {
			return fmt.Sprintf("replica not restarted yet: %+v", p)
		}
		if salecheck.Alive(pid) {
			return fmt.Sprintf("killed pid %d still alive", pid)
		}
		if ready := kubectl(t, nil, "get", "deployment", deploy, "-n", ns, "-o", "jsonpath={.status.readyReplicas}"); ready != "3" {
			return "deployment ready replicas " + ready + ", want 3"
		}
		return ""
	})
	if p := runnerState(t).PodsOf(ns, deploy)[0]; !strings.Contains(p.LastExit, "killed") {
		t.Errorf("last exit of the restarted replica: %q", p.LastExit)
	}

	rep := st.report(t)
	salecheck.Audit(t, rep)
	salecheck.Acked(t, ledger, ackedFile, rep.Acked)
}

// Every reservation expires; the sweeper is SIGKILLed in the middle of the
// pass that releases them, after the ledger recorded cancellations whose units
// are not back in Redis yet. The next pass (of a restarted replica) completes
// the releases, each unit once: the audit is exact.
//
// The kill lands mid-pass every run: a pass cancels a batch in the ledger
// first and then gives its units back in Redis, so with Redis refusing writes
// (CLIENT PAUSE WRITE) the pass is held between the two, and the test waits
// for exactly that state (cancelled in the ledger, not in stock) before it
// kills. The sweepers' interval is an hour, so the only passes are the ones
// each replica runs when it starts: none before the test restarts them.
func TestSweeperKilledMidPassNextPassCompletes(t *testing.T) {
	t.Parallel()
	storms.Lock()
	defer storms.Unlock()
	ns := namespaceName("sweeper-kill")
	const allocation = 4000
	// The sale's own Redis: pausing its writes touches no other test's sale.
	own, err := env.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	newNamespace(t, ns, own.Addr())
	s := applySale(t, ns, "sweeper-kill.yaml", map[string]any{"Allocation": allocation, "Interval": "1h"})
	deploy := s.name + "-sweeper"
	kubectl(t, nil, "rollout", "status", "-n", ns, "deployment/"+deploy, "--timeout=60s")

	// Every unit reserved, none paid; the audit comes after the next pass.
	ackedFile := filepath.Join(t.TempDir(), "acked")
	first := s.storm(t, "--buyers", strconv.Itoa(allocation), "--concurrency", "32", "--retry-ratio", "0",
		"--checkout-ratio", "0", "--cancel-ratio", "0", "--abandon-ratio", "1", "--audit=false", "--acked-file", ackedFile)
	reservedAt := time.Now()
	if first.Acked == 0 {
		t.Fatalf("the storm got no reservation: %v", first.Outcomes)
	}
	b, err := os.ReadFile(ackedFile)
	if err != nil {
		t.Fatal(err)
	}
	acked := strings.Fields(string(b))
	if units := salecheck.Units(t, ledger, s.uid); units["CANCELLED_BY_SWEEPER"] != 0 {
		t.Fatalf("a pass ran before the restart (ledger %v): the interval did not hold it off", units)
	}
	// Every reservation is past its TTL (6s) and grace (1s) by then.
	time.Sleep(time.Until(reservedAt.Add(8 * time.Second)))

	rdb := redis.NewClient(&redis.Options{Addr: own.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", "120000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	paused := true
	unpause := func() {
		if paused {
			paused = false
			if err := rdb.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Error(err)
			}
		}
	}
	defer unpause()
	var killed []int
	killBoth := func() {
		// Both running first: a replica in its restart backoff has no
		// process to kill. A process killed by the last call may still be
		// listed as running until the runner reaps it, so its pid does not
		// count.
		eventually(t, 60*time.Second, 50*time.Millisecond, func() string {
			running := 0
			for _, p := range runnerState(t).PodsOf(ns, deploy) {
				if p.Phase == podrunner.PhaseRunning && p.PID > 0 && p.Index >= 0 && !slices.Contains(killed, p.PID) {
					running++
				}
			}
			if running != 2 {
				return fmt.Sprintf("%d of 2 sweeper replicas running (not counting the pids killed last: %v)", running, killed)
			}
			return ""
		})
		killed = nil
		for i := range 2 {
			pid, err := env.RunnerAPI.Kill(ctx, ns, deploy, i)
			if err != nil {
				t.Fatal(err)
			}
			killed = append(killed, pid)
		}
	}
	// The restarted replicas' first pass starts; one of them leads it.
	killBoth()
	var units map[string]int64
	var inStock int64
	eventually(t, 60*time.Second, 50*time.Millisecond, func() string {
		units, inStock = salecheck.Units(t, ledger, s.uid), salecheck.RedisStock(t, s.redisAddr, s.uid, 1)
		if units["CANCELLED_BY_SWEEPER"] == 0 {
			return fmt.Sprintf("no pass cancelled anything yet (ledger %v)", units)
		}
		return ""
	})
	if units["CANCELLED_BY_SWEEPER"] <= inStock {
		t.Fatalf("Redis took writes while paused: %d units cancelled in the ledger, %d back in stock", units["CANCELLED_BY_SWEEPER"], inStock)
	}
	killBoth()
	t.Logf("SIGKILLed sweepers %v mid-pass: ledger %v, %d units back in stock", killed, units, inStock)
	unpause()
	// Replicas that restarted while Redis was still paused may have given
	// up their first pass and would wait an hour: restart them once more.
	killBoth()

	// The leader's first pass releases the rest; the one buyer here cancels,
	// so the audit's settled state is every unit back in stock.
	rep := s.storm(t, "--buyers", "1", "--count", "1", "--checkout-ratio", "0", "--cancel-ratio", "1", "--settle", "90s")
	salecheck.ReleasedOnce(t, ledger, rep, s.redisAddr, s.uid, 1, acked)
}
