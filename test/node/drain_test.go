package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// readyReserve counts the sale's reserve pods that are Running and ready.
func readyReserve(t *testing.T, ns string) int {
	t.Helper()
	out := kubectl(t, nil, "get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=reserve", "-o",
		`jsonpath={range .items[*]}{.status.phase}/{.status.containerStatuses[0].ready}{"\n"}{end}`)
	return strings.Count(out, "Running/true")
}

// keptReserve counts the sale's reserve pods that are Running and not being
// deleted: the ones no eviction took. Readiness is not asked: on a busy
// machine a probe can miss for a moment without any eviction.
func keptReserve(t *testing.T, ns string) int {
	t.Helper()
	out := kubectl(t, nil, "get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=reserve", "-o",
		`jsonpath={range .items[*]}{.status.phase}/{.metadata.deletionTimestamp}{"\n"}{end}`)
	return strings.Count(out, "Running/\n")
}

// `kubectl drain` of the only node during a storm: the reserve
// PodDisruptionBudget (one unavailable at most) lets one pod go, whose
// replacement has nowhere to run, and then refuses every other eviction, so
// the drain gives up with the other pods still serving; after uncordon the
// sale is whole again and the storm's audit is exact.
func TestDrainHonoursTheDisruptionBudgets(t *testing.T) {
	needNode(t)
	storms.Lock()
	defer storms.Unlock()
	ns := "drain"
	newShop(t, ns)
	s := applySale(t, ns, map[string]any{"Name": "drain", "Allocation": 100000, "Replicas": 3, "Memory": "64Mi"})
	t.Cleanup(func() { kubectl(t, nil, "uncordon", testharness.NodeName) })

	type result struct {
		rep *storm.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := s.runStorm("--buyers", "100000", "--count", "100000", "--duration", "45s", "--concurrency", "16",
			"--checkout-ratio", "0.3", "--cancel-ratio", "0.1")
		done <- result{rep, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	drained := make(chan error, 1)
	go func() {
		_, err := env.Kubectl(ctx, nil, "drain", testharness.NodeName, "--ignore-daemonsets", "--delete-emptydir-data",
			"--timeout=30s", "--grace-period=10")
		drained <- err
	}()
	// While the drain runs, the budget lets no more than one reserve pod go.
	minKept := 3
	var drainErr error
wait:
	for {
		select {
		case drainErr = <-drained:
			break wait
		case <-time.After(time.Second):
			minKept = min(minKept, keptReserve(t, ns))
		}
	}
	if drainErr == nil {
		t.Fatal("kubectl drain succeeded: the disruption budget let every reserve pod go")
	}
	if !strings.Contains(drainErr.Error(), "disruption budget") {
		t.Errorf("kubectl drain failed for another reason than the disruption budget: %v", drainErr)
	}
	if n := keptReserve(t, ns); n != 2 || minKept < 2 {
		t.Errorf("reserve pods not evicted: %d after the drain, %d at the fewest; the budget keeps 2 of 3", n, minKept)
	}
	// The two kept serve: ready again if a probe missed under load.
	eventuallyWithin(t, time.Minute, "the 2 kept reserve pods ready", func() bool { return readyReserve(t, ns) == 2 })
	kubectl(t, nil, "uncordon", testharness.NodeName)
	kubectl(t, nil, "rollout", "status", "deployment/drain-reserve", "-n", ns, "--timeout=170s")
	// The drain took the operator too (it has no budget); the next tests need it.
	kubectl(t, nil, "rollout", "status", "deployment/flashsale-controller-manager", "-n", localenv.ManagerNamespace, "--timeout=170s")
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	logStorm(t, res.rep)
	salecheck.Audit(t, res.rep)
}
