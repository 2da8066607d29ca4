package node_test

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// EnvSoak, set to 1, makes the big rebuild a million orders instead of
// 200,000 (about two minutes more; see docs/node.md).
const EnvSoak = "FLASHSALE_NODE_SOAK"

// managerLimit and managerRequest are config/manager/manager.yaml's memory
// limit and request.
const (
	managerLimit   = 256 << 20
	managerRequest = 128 << 20
)

// The manager, a pod with its 256Mi memory limit, rebuilds a large sale
// (acknowledged reservations seeded into the ledger, half paid, half still
// pending) after its Redis lost everything: the rebuild completes with exact
// counts, the kernel never OOM-kills the manager (its cgroup counts no OOM
// kill and the container did not restart), and the peak memory of its
// cgroup during the rebuild is logged.
func TestManagerRebuildsALargeSaleInsideItsMemoryLimit(t *testing.T) {
	needNode(t)
	orders := int64(200_000)
	if os.Getenv(EnvSoak) == "1" {
		orders = 1_000_000
	}
	ns := "bigsale"
	newShop(t, ns)
	own, podRedis := ownRedis(t, ns)
	allocation := orders + orders/10
	s := applySale(t, ns, map[string]any{"Name": "big", "Allocation": allocation, "Replicas": 1, "Memory": "64Mi", "RedisSecret": "own-redis"})
	s.redisAddr = podRedis

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if err := seedOrders(ctx, s.uid, s.sku, 4, orders); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d orders written to the ledger in %s", orders, time.Since(start).Round(time.Millisecond))

	mgr := pods(t, localenv.ManagerNamespace, "manager")
	if len(mgr) != 1 || len(mgr[0].Status.ContainerStatuses) != 1 {
		t.Fatalf("want one manager pod with one container, got %d", len(mgr))
	}
	restarts := mgr[0].Status.ContainerStatuses[0].RestartCount
	cg := podMemCgroups(t, localenv.ManagerNamespace, mgr[0].Metadata.Name)
	if got := cgroupInt(t, cg.container, "memory.limit_in_bytes"); got != managerLimit {
		t.Fatalf("the manager's cgroup memory.limit_in_bytes is %d, want 256Mi", got)
	}
	killsBefore := cgroupKeyed(t, cg.container, "memory.oom_control")["oom_kill"]
	// The peak from here on (writing 0 resets memory.max_usage_in_bytes).
	if err := os.WriteFile(cg.container+"/memory.max_usage_in_bytes", []byte("0"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := cgroupInt(t, cg.container, "memory.usage_in_bytes")

	rdb := redis.NewClient(&redis.Options{Addr: own.Addr()})
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	type rebuild struct {
		Time            time.Time `json:"time"`
		Available       int64     `json:"available"`
		Reserved        int64     `json:"reserved"`
		Sold            int64     `json:"sold"`
		RestoredOrders  int64     `json:"restoredOrders"`
		DurationSeconds string    `json:"durationSeconds"`
	}
	var rb rebuild
	eventuallyWithin(t, 4*time.Minute, "the rebuild of the large sale", func() bool {
		out, err := env.Kubectl(ctx, nil, "get", "flashsale", "big", "-n", ns, "-o", "jsonpath={.status.lastRebuild}")
		if err != nil || strings.TrimSpace(out) == "" {
			return false
		}
		if err := json.Unmarshal([]byte(out), &rb); err != nil {
			t.Fatalf("status.lastRebuild %q: %v", out, err)
		}
		return !rb.Time.Add(time.Second).Before(lost) // metav1.Time has seconds
	})
	took := time.Since(lost)
	pending, paid := orders/2, orders/2
	if rb.RestoredOrders != pending || rb.Reserved != pending || rb.Sold != paid || rb.Available != allocation-orders {
		t.Fatalf("rebuild restored %+v, want %d pending orders (reserved), %d sold, %d available", rb, pending, paid, allocation-orders)
	}
	kubectl(t, nil, "wait", "-n", ns, "--for=condition=Ready", "flashsale/big", "--timeout=170s")

	peak := cgroupInt(t, cg.container, "memory.max_usage_in_bytes")
	st := cgroupKeyed(t, cg.container, "memory.stat")
	kills := cgroupKeyed(t, cg.container, "memory.oom_control")["oom_kill"]
	t.Logf("rebuild of %d orders: %s in status, %s from the loss to the status; manager cgroup usage %.1f MiB before, peak %.1f MiB (memory.max_usage_in_bytes, the v1 memory.peak) of its 256 MiB limit; now rss %.1f MiB, cache %.1f MiB, failcnt %d",
		orders, rb.DurationSeconds, took.Round(time.Millisecond), mib(before), mib(peak), mib(st["total_rss"]), mib(st["total_cache"]), cgroupInt(t, cg.container, "memory.failcnt"))
	// Bounded by live state, not by the sale's size: the rebuild fits in
	// what the manager's pod requests (128Mi), with room to spare.
	if peak >= managerRequest {
		t.Errorf("the manager's cgroup peaked at %.1f MiB during the rebuild, not below its 128 MiB request", mib(peak))
	}
	if kills != killsBefore {
		t.Fatalf("the kernel OOM-killed in the manager's cgroup during the rebuild (oom_kill %d -> %d)", killsBefore, kills)
	}
	now := pods(t, localenv.ManagerNamespace, "manager")
	if len(now) != 1 || now[0].Metadata.Name != mgr[0].Metadata.Name || now[0].Status.ContainerStatuses[0].RestartCount != restarts {
		t.Fatalf("the manager restarted during the rebuild: %+v", now)
	}

	// The rebuilt sale sells on, exact.
	rep := s.storm(t, "--buyers", "5000", "--count", "1000", "--concurrency", "16", "--checkout-ratio", "0.3")
	salecheck.Audit(t, rep)
}

// seedOrders writes n acknowledged reservations of the sale straight into
// the ledger with COPY (its triggers keep the shard counts, as the writer's
// inserts do): even ones paid, odd ones pending for an hour, each on its
// buyer's home shard, under the campaign's current epoch.
func seedOrders(ctx context.Context, campaign, sku string, shards int, n int64) error {
	var epoch int64
	if err := ledger.QueryRow(ctx, "SELECT epoch FROM flashsale_campaigns WHERE campaign_id = $1", campaign).Scan(&epoch); err != nil {
		return err
	}
	secret := []byte("node-test-seeded-orders")
	expires := time.Now().Add(time.Hour)
	cols := []string{"reservation_id", "request_key", "campaign_id", "sku", "user_id", "shard", "quantity", "status", "epoch", "expires_at", "payment_token"}
	i := int64(0)
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i >= n {
			return nil, nil
		}
		user := "seeded-" + strconv.FormatInt(i, 10)
		shard := stock.HomeShard(user, shards)
		key := stock.ReservationKey(secret, campaign, user, "r")
		row := []any{stock.FormatID(shard, key), key, campaign, sku, user, int32(shard), int32(1), "PENDING", epoch, expires, nil}
		if i%2 == 0 {
			row[7], row[10] = "COMMITTED", "pay-"+user
		}
		i++
		return row, nil
	})
	if _, err := ledger.CopyFrom(ctx, pgx.Identifier{"flashsale_orders"}, cols, src); err != nil {
		return err
	}
	_, err := ledger.Exec(ctx, "ANALYZE flashsale_orders")
	return err
}
