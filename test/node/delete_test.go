package node_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// Deleting a FlashSale on the real node: the operator's finalizer removes its
// Redis keys and its children, the kubelet stops the pods (their processes
// end, their cgroups are removed, the Service's endpoints go), and the ledger
// keeps the orders and marks the campaign deleted. test/e2e has the same case
// on the pod runner.
func TestDeletedSaleStopsItsPodsAndKeepsTheLedger(t *testing.T) {
	needNode(t)
	ns := "deleted"
	newShop(t, ns)
	s := applySale(t, ns, map[string]any{"Name": "doomed", "Allocation": 1000, "Replicas": 2, "Memory": "64Mi"})
	for _, d := range []string{"-reserve", "-sweeper"} {
		kubectl(t, nil, "rollout", "status", "-n", ns, "deployment/"+s.name+d, "--timeout=170s")
	}
	storms.Lock()
	rep := s.storm(t, "--buyers", "500", "--concurrency", "8")
	storms.Unlock()
	salecheck.Audit(t, rep)
	before := salecheck.Units(t, ledger, s.uid)

	// The pods' processes, found through their cgroups (as the kernel sees
	// them, not as the API reports them).
	var pids []int
	var cgroups []string
	for _, component := range []string{"reserve", "sweeper"} {
		for _, p := range pods(t, ns, component) {
			cg := podMemCgroups(t, ns, p.Metadata.Name)
			cgroups = append(cgroups, cg.pod)
			pids = append(pids, cgroupPIDs(t, cg.container)...)
		}
	}
	if len(cgroups) != 4 || len(pids) < 4 {
		t.Fatalf("%d pods with %d processes run for the sale, want 2 reserve and 2 sweeper pods", len(cgroups), len(pids))
	}
	rdb := redis.NewClient(&redis.Options{Addr: env.Redis.Addr()})
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
	if len(keys()) == 0 {
		t.Fatal("the sale has no Redis keys before its deletion")
	}

	kubectl(t, nil, "delete", "flashsale", s.name, "-n", ns, "--timeout=120s")
	eventually(t, "the sale's pods stopped by the kubelet", func() bool {
		left := strings.TrimSpace(kubectl(t, nil, "get", "deployments,replicasets,pods,services,endpointslices,poddisruptionbudgets", "-n", ns, "-o", "name"))
		if left != "" {
			return false
		}
		for _, pid := range pids {
			if salecheck.Alive(pid) {
				return false
			}
		}
		for _, cg := range cgroups {
			if _, err := os.Stat(cg); err == nil {
				return false
			}
		}
		return true
	})
	if left := keys(); len(left) > 0 {
		t.Errorf("%d Redis keys left, e.g. %s", len(left), left[0])
	}
	salecheck.KeptAfterDeletion(t, ledger, s.uid, before)
}
