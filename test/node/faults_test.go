package node_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/failpoint"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// backgroundStorm is a storm running beside the test.
type backgroundStorm struct {
	done chan struct{}
	rep  *storm.Report
	err  error
}

func (s *sale) startStorm(args ...string) *backgroundStorm {
	b := &backgroundStorm{done: make(chan struct{})}
	go func() {
		defer close(b.done)
		b.rep, b.err = s.runStorm(args...)
	}()
	return b
}

// running fails the test if the storm is over: the fault just made must
// have landed in the middle of it.
func (b *backgroundStorm) running(t *testing.T, fault string) {
	t.Helper()
	select {
	case <-b.done:
		t.Fatalf("the storm ended before %s: the fault did not land mid-storm", fault)
	default:
	}
}

func (b *backgroundStorm) report(t *testing.T) *storm.Report {
	t.Helper()
	<-b.done
	if b.err != nil {
		t.Fatal(b.err)
	}
	logStorm(t, b.rep)
	return b.rep
}

// waitOrders waits for the sale's ledger to hold more than n orders (the
// storm's first acknowledged reservations).
func (s *sale) waitOrders(t *testing.T, n int64) {
	t.Helper()
	eventually(t, "the storm's first reservations in the ledger", func() bool {
		var all int64
		for _, u := range salecheck.Units(t, ledger, s.uid) {
			all += u
		}
		return all > n
	})
}

// Redis loses everything in the middle of a storm through the Service: the
// reserve pods refuse on every shard at once, the sale says FailClosed, the
// manager's pod rebuilds the stock from the ledger, the storm goes on, the
// audit is exact and reservations acknowledged before the loss are paid for
// (salecheck's sequence, the one test/e2e runs on the pod runner).
func TestRedisLostMidStormIsRebuiltFromTheLedger(t *testing.T) {
	needNode(t)
	t.Parallel()
	ns := "redis-loss"
	newShop(t, ns)
	own, podRedis := ownRedis(t, ns)
	// Reservations outlive the loss and the rebuild, and expire soon
	// enough for the storm's audit to settle.
	s := applySale(t, ns, map[string]any{"Name": "loss", "Allocation": 20000, "Replicas": 2, "Memory": "64Mi",
		"TTL": "30s", "Grace": "1s", "SweepInterval": "1s", "RedisSecret": "own-redis"})
	s.redisAddr = podRedis
	storms.Lock()
	defer storms.Unlock()
	c := s.check()
	held := c.Hold(t, 3)
	phases := c.WatchPhases(t)

	st := s.startStorm("--buyers", "100000", "--duration", "15s", "--concurrency", "8",
		"--checkout-ratio", "0.8", "--cancel-ratio", "0.2", "--settle", "90s")
	s.waitOrders(t, int64(len(held)))
	if err := own.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	st.running(t, "Redis restarted empty")
	t.Log("Redis restarted empty mid-storm")
	rebuiltAt := c.RebuiltAfterLoss(t, phases, held, 2*time.Minute)
	c.SettledAfterRebuild(t, ledger, st.report(t), rebuiltAt, held)
}

// A reserve container's process, found through its cgroup, is SIGKILLed in
// the middle of a storm through the Service: the kubelet restarts the
// container (exit 137), the Deployment is whole again, and every
// reservation the storm was told about (201) is in the ledger, the audit
// exact.
//
// The audit waits for quiescence (reservations expire in 10 s, the sweeper
// runs every second), as the OOM test's does: a checkout killed between its
// ledger commit and its Redis step leaves its unit RESERVED in Redis and
// COMMITTED in the ledger, counted twice until the sweeper settles it (a
// run failed with available + reserved + sold one above the allocation).
func TestReserveKilledMidStormLosesNoAcknowledgement(t *testing.T) {
	needNode(t)
	t.Parallel()
	ns := "reserve-kill"
	newShop(t, ns)
	s := applySale(t, ns, map[string]any{"Name": "kill", "Allocation": 20000, "Replicas": 3, "Memory": "64Mi",
		"TTL": "10s", "Grace": "2s", "SweepInterval": "1s"})
	kubectl(t, nil, "rollout", "status", "deployment/kill-reserve", "-n", ns, "--timeout=170s")
	storms.Lock()
	defer storms.Unlock()
	reserve := pods(t, ns, "reserve")
	if len(reserve) != 3 {
		t.Fatalf("%d reserve pods, want 3", len(reserve))
	}
	victim := reserve[0].Metadata.Name
	restarts := reserve[0].Status.ContainerStatuses[0].RestartCount
	pids := cgroupPIDs(t, podMemCgroups(t, ns, victim).container)
	if len(pids) != 1 {
		t.Fatalf("reserve container of %s runs %v, want its one process", victim, pids)
	}
	if cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pids[0]) + "/cmdline"); err != nil || !strings.Contains(string(cmd), "reserve") {
		t.Fatalf("pid %d of %s's cgroup is %q (%v), not the reserve process", pids[0], victim, cmd, err)
	}

	ackedFile := filepath.Join(t.TempDir(), "acked")
	st := s.startStorm("--buyers", "100000", "--duration", "15s", "--concurrency", "16",
		"--checkout-ratio", "0.5", "--cancel-ratio", "0.1", "--acked-file", ackedFile, "--settle", "90s")
	s.waitOrders(t, 0)
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st.running(t, "the reserve process was killed")
	t.Logf("SIGKILLed %s (pid %d) mid-storm", victim, pids[0])

	eventuallyWithin(t, 3*time.Minute, "the killed container restarted by the kubelet and the Deployment whole", func() bool {
		if salecheck.Alive(pids[0]) {
			return false
		}
		for _, p := range pods(t, ns, "reserve") {
			if p.Metadata.Name != victim {
				continue
			}
			cs := p.Status.ContainerStatuses[0]
			if last := cs.LastState.Terminated; cs.RestartCount == restarts+1 && last != nil && last.ExitCode != 137 {
				t.Fatalf("%s's container ended %s (exit %d), want killed (137)", victim, last.Reason, last.ExitCode)
			}
			ready := kubectl(t, nil, "get", "deployment", "kill-reserve", "-n", ns, "-o", "jsonpath={.status.readyReplicas}")
			return cs.RestartCount == restarts+1 && cs.Ready && ready == "3"
		}
		t.Fatalf("pod %s is gone: the kubelet restarts the container, nothing replaces the pod", victim)
		return false
	})
	rep := st.report(t)
	salecheck.Audit(t, rep)
	salecheck.Acked(t, ledger, ackedFile, rep.Acked)
}

// Every reservation expires, and the sweepers die at the failpoint between
// a pass's ledger cancellations and its releases in Redis (the step is set
// in their Deployment's environment, which the operator leaves alone: its
// own env comes first): the kubelet restarts them and they die there again,
// so the ledger holds cancellations whose units are not back in stock, every
// run. With the step unset, the next pass completes the releases, each unit
// once.
func TestSweeperKilledMidPassNextPassCompletes(t *testing.T) {
	needNode(t)
	t.Parallel()
	ns := "sweeper-kill"
	newShop(t, ns)
	const allocation = 400
	s := applySale(t, ns, map[string]any{"Name": "sweep", "Allocation": allocation, "Replicas": 1, "Memory": "64Mi",
		"TTL": "6s", "Grace": "1s", "SweepInterval": "1s"})
	deploy := "deployment/sweep-sweeper"
	// Set before any reservation: a pass with nothing expired reaches no
	// step, so the sweepers run (and turn ready) until the storm's expire.
	setFailpoint := func(value string) {
		kubectl(t, nil, "set", "env", deploy, "-n", ns, value)
		kubectl(t, nil, "rollout", "status", deploy, "-n", ns, "--timeout=170s")
		eventually(t, "only the sweeper pods of the new template", func() bool {
			p := pods(t, ns, "sweeper")
			for _, pd := range p {
				if pd.Metadata.DeletionTimestamp != nil {
					return false
				}
			}
			return len(p) == 2
		})
	}
	setFailpoint(failpoint.Env + "=" + failpoint.SweepAfterLedgerCancel)
	sweepers := pods(t, ns, "sweeper")

	// Every unit reserved, none paid; the buyers walk away.
	ackedFile := filepath.Join(t.TempDir(), "acked")
	storms.Lock()
	first := s.storm(t, "--buyers", strconv.Itoa(allocation), "--concurrency", "16", "--retry-ratio", "0",
		"--checkout-ratio", "0", "--cancel-ratio", "0", "--abandon-ratio", "1", "--audit=false", "--acked-file", ackedFile)
	storms.Unlock()
	b, err := os.ReadFile(ackedFile)
	if err != nil {
		t.Fatal(err)
	}
	acked := strings.Fields(string(b))
	if first.Acked == 0 || len(acked) != first.Acked {
		t.Fatalf("the storm got %d reservations, %d ids in its --acked-file: %v", first.Acked, len(acked), first.Outcomes)
	}
	inStock := salecheck.RedisStock(t, env.Redis.Addr(), s.uid, 4)

	// Both sweepers (the active one, then the standby that takes over) die
	// at the step, each after its pass cancelled in the ledger.
	salecheck.Eventually(t, 3*time.Minute, time.Second, func() string {
		var state []string
		killed := 0
		for _, p := range pods(t, ns, "sweeper") {
			cs := p.Status.ContainerStatuses[0]
			if last := cs.LastState.Terminated; last != nil {
				if last.ExitCode != 137 {
					t.Fatalf("sweeper %s ended %s (exit %d), want killed at the failpoint (137)", p.Metadata.Name, last.Reason, last.ExitCode)
				}
				killed++
			}
			state = append(state, fmt.Sprintf("%s: %d restarts, ready %v", p.Metadata.Name, cs.RestartCount, cs.Ready))
		}
		if killed != len(sweepers) {
			return fmt.Sprintf("%d of %d sweepers killed at the failpoint (%s); ledger %v", killed, len(sweepers),
				strings.Join(state, "; "), salecheck.Units(t, ledger, s.uid))
		}
		return ""
	})
	units := salecheck.Units(t, ledger, s.uid)
	if units["CANCELLED_BY_SWEEPER"] == 0 {
		t.Fatalf("the sweepers died without a cancellation in the ledger: %v", units)
	}
	if got := salecheck.RedisStock(t, env.Redis.Addr(), s.uid, 4); got != inStock {
		t.Fatalf("%d units in stock, %d before the passes: a unit came back although every pass died before its releases", got, inStock)
	}
	t.Logf("sweepers killed mid-pass: ledger %v, %d of %d units in stock", units, inStock, allocation)

	setFailpoint(failpoint.Env + "-")
	// The next pass releases the rest; the one buyer here cancels, so the
	// audit's settled state is every unit back in stock.
	storms.Lock()
	rep := s.storm(t, "--buyers", "1", "--count", "1", "--checkout-ratio", "0", "--cancel-ratio", "1", "--settle", "90s")
	storms.Unlock()
	salecheck.ReleasedOnce(t, ledger, rep, env.Redis.Addr(), s.uid, 4, acked)
}

// A scheduled drop on the node, rescheduled once its pods run to open in
// 20 s: NOT_STARTED until then, open on time, paused, ended, Completed
// (salecheck's sequence, the one test/e2e runs on the pod runner).
func TestScheduledDropOpensPausesEndsAndCompletes(t *testing.T) {
	needNode(t)
	t.Parallel()
	ns := "scheduled"
	newShop(t, ns)
	later := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	s := applySale(t, ns, map[string]any{"Name": "drop", "Allocation": 10, "Replicas": 1, "Memory": "64Mi",
		"TTL": "1m", "Grace": "1s", "SweepInterval": "1s",
		"Start": later.Format(time.RFC3339), "End": later.Add(time.Hour).Format(time.RFC3339)})
	start := time.Now().Add(20 * time.Second).UTC().Truncate(time.Second)
	c := s.check()
	c.Patch(t, `{"schedule":{"start":"`+start.Format(time.RFC3339)+`"}}`)
	c.ScheduledDrop(t, start)
}
