package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// A scheduled drop: 425 NOT_STARTED until its start, 201 from then on; paused,
// 503 PAUSED; once its end has passed, 410 ENDED and, with nothing left
// reserved, the phase Completed.
func TestScheduledDropOpensPausesEndsAndCompletes(t *testing.T) {
	t.Parallel()
	ns := namespaceName("scheduled")
	newNamespace(t, ns, env.Redis.Addr())
	start := time.Now().Add(45 * time.Second).UTC().Truncate(time.Second)
	s := applySale(t, ns, "scheduled.yaml", map[string]any{
		"Start": start.Format(time.RFC3339), "End": start.Add(time.Hour).Format(time.RFC3339),
	})
	if phase := getSale(t, ns, s.name).Status.Phase; phase != "Scheduled" {
		t.Fatalf("phase %s before the start, want Scheduled", phase)
	}
	alice := s.buyer(t, "alice")

	// Before the start every attempt is refused; from the start it succeeds.
	var reservation string
	notStarted := 0
	for i := 0; reservation == ""; i++ {
		a := alice.reserve(t, fmt.Sprintf("attempt-%d", i))
		now := time.Now()
		switch {
		case a.Status == http.StatusTooEarly && a.Code == "NOT_STARTED":
			notStarted++
			if now.After(start.Add(10 * time.Second)) {
				t.Fatalf("still NOT_STARTED %v after the start", now.Sub(start))
			}
		case a.Status == http.StatusCreated:
			if now.Before(start) {
				t.Fatalf("reserved %v before the start", start.Sub(now))
			}
			reservation = a.ReservationID
			t.Logf("first reservation %v after the start", now.Sub(start).Round(time.Millisecond))
		default:
			t.Fatalf("reserve: %+v", a)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if notStarted == 0 {
		t.Fatal("the sale became Ready only after its start: the test saw no NOT_STARTED")
	}
	waitPhase(t, s, "Open")

	// The status says Paused once every shard's gate is closed.
	kubectl(t, nil, "patch", "flashsale", s.name, "-n", ns, "--type", "merge", "-p", `{"spec":{"paused":true}}`)
	waitPhase(t, s, "Paused")
	if a := s.buyer(t, "bob").reserve(t, "while-paused"); a.Status != http.StatusServiceUnavailable || a.Code != "PAUSED" {
		t.Fatalf("reserve while paused: %+v", a)
	}
	// A reservation taken before the pause can still be paid for.
	if a := alice.checkout(t, reservation); a.Status != http.StatusOK {
		t.Fatalf("checkout while paused: %+v", a)
	}

	end := time.Now().Add(2 * time.Second).UTC().Truncate(time.Second).Add(time.Second)
	kubectl(t, nil, "patch", "flashsale", s.name, "-n", ns, "--type", "merge", "-p",
		fmt.Sprintf(`{"spec":{"schedule":{"end":%q}}}`, end.Format(time.RFC3339)))
	carol := s.buyer(t, "carol")
	eventually(t, 20*time.Second, 200*time.Millisecond, func() string {
		a := carol.reserve(t, "after-the-end")
		if a.Status != http.StatusGone || a.Code != "ENDED" {
			return fmt.Sprintf("reserve after the end: %+v", a)
		}
		if time.Now().Before(end) {
			t.Fatalf("ENDED %v before the end", time.Until(end))
		}
		return ""
	})
	waitPhase(t, s, "Completed")
	fs := getSale(t, ns, s.name)
	if fs.Status.Sold != 1 || fs.Status.Reserved != 0 || fs.Status.Available != 9 {
		t.Errorf("completed with available %d, reserved %d, sold %d; want 9, 0, 1", fs.Status.Available, fs.Status.Reserved, fs.Status.Sold)
	}
}

// waitPhase waits with kubectl for a phase; on a timeout it shows the status.
func waitPhase(t *testing.T, s *sale, phase string) {
	t.Helper()
	_, err := env.Kubectl(context.Background(), nil, "wait", "-n", s.ns, "--for=jsonpath={.status.phase}="+phase,
		"flashsale/"+s.name, "--timeout=30s")
	if err != nil {
		t.Fatalf("%v\n%s", err, kubectl(t, nil, "get", "flashsale", s.name, "-n", s.ns, "-o", "yaml"))
	}
}

// Deleting a FlashSale stops its processes and removes its Redis keys; the
// ledger keeps its orders.
func TestDeletedSaleStopsItsProcessesAndKeepsTheLedger(t *testing.T) {
	t.Parallel()
	ns := namespaceName("deleted")
	newNamespace(t, ns, env.Redis.Addr())
	s := applySale(t, ns, "doomed.yaml", nil)
	for _, d := range []string{"-reserve", "-sweeper"} {
		kubectl(t, nil, "rollout", "status", "-n", ns, "deployment/"+s.name+d, "--timeout=60s")
	}
	rep := s.storm(t, "--buyers", "500", "--concurrency", "8")
	salecheck.Audit(t, rep)

	before := salecheck.Units(t, ledger, s.uid)
	var pids []int
	for _, p := range runnerState(t).Pods {
		if p.Namespace == ns && p.PID != 0 {
			pids = append(pids, p.PID)
		}
	}
	if len(pids) != 4 {
		t.Fatalf("%d processes run for the sale, want 2 reserve and 2 sweeper replicas", len(pids))
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.redisAddr})
	defer rdb.Close()
	keys := func() []string {
		var all []string
		for shard := range 4 {
			ks, err := rdb.Keys(context.Background(), stock.ShardKeys(s.uid, shard).Pattern()).Result()
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, ks...)
		}
		return all
	}
	if n := len(keys()); n == 0 {
		t.Fatal("the sale has no Redis keys before its deletion")
	}

	kubectl(t, nil, "delete", "flashsale", s.name, "-n", ns, "--timeout=60s")
	if left := kubectl(t, nil, "get", "deployments,services,poddisruptionbudgets", "-n", ns, "-o", "name"); strings.TrimSpace(left) != "" {
		t.Errorf("children left after the deletion: %s", left)
	}
	eventually(t, 30*time.Second, 100*time.Millisecond, func() string {
		for _, pid := range pids {
			if salecheck.Alive(pid) {
				return fmt.Sprintf("pid %d of the deleted sale still runs", pid)
			}
		}
		st := runnerState(t)
		for _, p := range st.Pods {
			if p.Namespace == ns {
				return "the runner still has " + p.Name
			}
		}
		if _, ok := st.ServiceURL(ns, s.name+"-reserve", 0); ok {
			return "the runner still exposes the reserve Service"
		}
		return ""
	})
	if left := keys(); len(left) > 0 {
		t.Errorf("%d Redis keys left, e.g. %s", len(left), left[0])
	}
	salecheck.KeptAfterDeletion(t, ledger, s.uid, before)
}
