package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// alive tells whether a pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

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
	time.Sleep(2 * time.Second)
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
		if alive(pid) {
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
	checkAudit(t, rep)
	b, err := os.ReadFile(ackedFile)
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Fields(string(b))
	if len(ids) != rep.Acked {
		t.Fatalf("%d acknowledged ids in --acked-file, the report says %d", len(ids), rep.Acked)
	}
	statuses := ledgerStatuses(t, ids)
	lost := 0
	for _, id := range ids {
		if s, ok := statuses[id]; !ok || s == "ABANDONED" {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged reservation %s: ledger status %q", id, s)
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged reservations lost", lost, len(ids))
	}
}

// redisStock sums the stock counters of a sale's shards, read from Redis.
func redisStock(t *testing.T, addr, uid string, shards int) int64 {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	var sum int64
	for i := range shards {
		n, err := rdb.Get(context.Background(), stock.ShardKeys(uid, i).Stock()).Int64()
		if err != nil {
			t.Fatal(err)
		}
		sum += n
	}
	return sum
}

// Every reservation expires; the sweeper is SIGKILLed in the middle of the
// pass that releases them, after the ledger recorded cancellations whose units
// are not back in Redis yet. The next pass (of a restarted replica) completes
// the releases, each unit once: the audit is exact.
func TestSweeperKilledMidPassNextPassCompletes(t *testing.T) {
	t.Parallel()
	storms.Lock()
	defer storms.Unlock()
	ns := namespaceName("sweeper-kill")
	const allocation = 4000
	newNamespace(t, ns, env.Redis.Addr())
	s := applySale(t, ns, "sweeper-kill.yaml", map[string]any{"Allocation": allocation, "Interval": "3s"})
	deploy := s.name + "-sweeper"
	kubectl(t, nil, "rollout", "status", "-n", ns, "deployment/"+deploy, "--timeout=60s")

	st := s.startStorm(t, "--buyers", strconv.Itoa(allocation), "--concurrency", "32", "--retry-ratio", "0",
		"--checkout-ratio", "0", "--cancel-ratio", "0", "--abandon-ratio", "1", "--settle", "90s")

	// The first cancellation in the ledger means a pass is releasing.
	var cancelled int64
	deadline := time.Now().Add(60 * time.Second)
	for cancelled == 0 {
		if err := ledger.QueryRow(context.Background(),
			`SELECT count(*) FROM flashsale_orders WHERE campaign_id = $1 AND status = 'CANCELLED_BY_SWEEPER'`, s.uid).Scan(&cancelled); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no sweeper cancelled anything within 60s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	// Both replicas: only one of them sweeps, and either may hold the lock.
	var killed []int
	for i := range 2 {
		pid, err := env.RunnerAPI.Kill(context.Background(), ns, deploy, i)
		if err != nil {
			t.Fatal(err)
		}
		killed = append(killed, pid)
	}
	units := ledgerUnits(t, s.uid)
	inStock := redisStock(t, s.redisAddr, s.uid, 1)
	t.Logf("SIGKILLed sweepers %v: ledger %v, %d units back in stock", killed, units, inStock)
	if units["CANCELLED_BY_SWEEPER"] <= inStock {
		t.Fatalf("the pass was not interrupted: %d units cancelled in the ledger, %d back in stock", units["CANCELLED_BY_SWEEPER"], inStock)
	}

	rep := st.report(t)
	checkAudit(t, rep)
	a := rep.Audit
	if !a.Settled || a.Available != allocation || a.Sold != 0 || a.Reserved != 0 || a.Pending != 0 {
		t.Fatalf("after the next pass: available %d, reserved %d, sold %d, pending %d; want all %d units back", a.Available, a.Reserved, a.Sold, a.Pending, allocation)
	}
	units = ledgerUnits(t, s.uid)
	if units["CANCELLED_BY_SWEEPER"] != int64(rep.Acked) || units["ABANDONED"] != 0 || units["PENDING"] != 0 {
		t.Errorf("ledger %v, want all %d acknowledged reservations CANCELLED_BY_SWEEPER", units, rep.Acked)
	}
	if got := redisStock(t, s.redisAddr, s.uid, 1); got != allocation {
		t.Errorf("Redis stock %d, want %d: a unit was released twice or never", got, allocation)
	}
	// The replica that did not take the next pass may still wait out its
	// restart backoff on a loaded machine: wait for it rather than race it.
	restartDeadline := time.Now().Add(30 * time.Second)
	for {
		var waiting []string
		for _, p := range runnerState(t).PodsOf(ns, deploy) {
			if p.Restarts < 1 {
				waiting = append(waiting, fmt.Sprintf("%s %+v", p.Name, p))
			}
		}
		if len(waiting) == 0 {
			break
		}
		if time.Now().After(restartDeadline) {
			t.Fatalf("sweeper replicas not restarted within 30s: %v", waiting)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
