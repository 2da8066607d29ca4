package stock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Readiness pings the shards' servers by key: a cluster client whose slot map
// came back empty (reloaded from a node not yet joined, during a whole-cluster
// restart) fails a keyless PING until its next refresh; by key it reaches a
// known node.
func TestPingAnswersWithAnEmptySlotMap(t *testing.T) {
	c, rdb := cluster(t)
	campaign := "c-" + randomID()
	openSale(t, rdb, campaign, 3, 4)
	empty := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        c.Addrs(),
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { return nil, nil },
	})
	t.Cleanup(func() { _ = empty.Close() })
	ctx := context.Background()
	if err := empty.Ping(ctx).Err(); err == nil {
		t.Fatal("a keyless PING with an empty slot map answered: the test shows nothing")
	}
	if err := stock.New(empty, campaign, 3).Ping(ctx); err != nil {
		t.Fatalf("Store.Ping: %v", err)
	}
}

// Shards seeded before metas recorded their server (no srv) keep selling, and
// Stamp records the server once, after which a restart is caught as for any
// other shard.
func TestStampShardsWithoutServer(t *testing.T) {
	r, rdb := standalone(t)
	s := openSale(t, rdb, "c-"+randomID(), 3, 10)
	ctx := context.Background()
	for i := range 3 {
		if err := rdb.HDel(ctx, s.Keys(i).Meta(), "srv").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if res, err := reserveHome(ctx, s, fmt.Sprintf("old-%d", i)); err != nil || res.Code != stock.Reserved {
			t.Fatalf("a shard without srv: %+v %v", res, err)
		}
	}
	if n, err := s.Stamp(ctx); err != nil || n != 3 {
		t.Fatalf("stamped %d, %v", n, err)
	}
	if n, err := s.Stamp(ctx); err != nil || n != 0 {
		t.Fatalf("stamped again: %d, %v", n, err)
	}
	id := testharness.RunID(t, rdb)
	for i := range 3 {
		if got := rdb.HGet(ctx, s.Keys(i).Meta(), "srv").Val(); got != id {
			t.Fatalf("shard %d srv %q, want %q", i, got, id)
		}
	}
	if err := r.RestartWithData(); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 10*time.Second, "redis back", func() bool { return rdb.Ping(ctx).Err() == nil })
	if res, err := reserveHome(ctx, s, "new"); err != nil || res.Code != stock.Closed || res.Status != stock.ReasonUnverified {
		t.Fatalf("after the restart: %+v %v", res, err)
	}
}
