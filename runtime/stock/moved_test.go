package stock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// No re-send after a timeout does not mean no redirect: a script sent to a
// master that no longer serves its slot (a resharding, a failover the slot
// map has not caught up with) is answered MOVED without running, and the
// cluster client sends it on to the new master, where it runs once.
func TestScriptFollowsMoved(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := testharness.RedisClusterT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var masters []string
	for _, n := range c.Nodes() {
		masters = append(masters, n.Addr())
	}
	if err := loadScripts(masters); err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer admin.Close()
	rdb := config.Redis{Mode: config.RedisCluster, Addresses: c.Addrs()}.Client()
	defer rdb.Close()

	const campaign = "moved"
	setup := stock.New(admin, campaign, 1)
	if err := then(seed(5), reserved(stock.Reserved, stock.ModeHome))(ctx, setup); err != nil {
		t.Fatal(err)
	}
	s := stock.New(rdb, campaign, 1)
	if _, err := s.State(ctx); err != nil { // the client's slot map, before the move
		t.Fatal(err)
	}
	metaKey := s.Keys(0).Meta()
	slot, err := admin.ClusterKeySlot(ctx, metaKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	from, err := admin.MasterForKey(ctx, metaKey)
	if err != nil {
		t.Fatal(err)
	}
	var to *testharness.Redis
	for _, n := range c.Nodes() {
		if n.Addr() != from.Options().Addr {
			to = n
			break
		}
	}
	if err := c.MoveSlot(int(slot), to); err != nil {
		t.Fatal(err)
	}
	if cur, err := rdb.(*redis.ClusterClient).MasterForKey(ctx, metaKey); err != nil || cur.Options().Addr != from.Options().Addr {
		t.Fatalf("the client under test already knows the move (%v %v): the test would not meet MOVED", cur, err)
	}
	for _, addr := range masters {
		if err := redisOn(addr).ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	res, err := s.Release(ctx, 0, key)
	if err != nil || res.Code != stock.Released {
		t.Fatalf("release after the slot moved: %+v %v", res, err)
	}
	if runs := scriptRuns(t, masters); runs != 1 {
		t.Fatalf("the release ran %d times", runs)
	}
	if st, err := setup.State(ctx); err != nil || st[0].Available != 5 || st[0].Reserved != 0 {
		t.Fatalf("after the release: %+v %v", st, err)
	}
}
