package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// A scheduled drop: 425 NOT_STARTED until its start, 201 from then on; paused,
// 503 PAUSED; once its end has passed, 410 ENDED and, with nothing left
// reserved, the phase Completed. test/node has the same case on a real node.
func TestScheduledDropOpensPausesEndsAndCompletes(t *testing.T) {
	t.Parallel()
	ns := namespaceName("scheduled")
	newNamespace(t, ns, env.Redis.Addr())
	start := time.Now().Add(45 * time.Second).UTC().Truncate(time.Second)
	s := applySale(t, ns, "scheduled.yaml", map[string]any{
		"Start": start.Format(time.RFC3339), "End": start.Add(time.Hour).Format(time.RFC3339),
	})
	s.check().ScheduledDrop(t, start)
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
