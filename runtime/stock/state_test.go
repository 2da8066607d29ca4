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

// A master that does not answer makes State fail, even while another
// shard's stock key is absent (a shard being rebuilt). The pipeline reports
// its first failed command only, and that shard's redis.Nil used to hide the
// stall: the stalled master's live shards then read as shards whose data was
// lost, and the sale was failed closed and rebuilt instead of waiting.
func TestStateFailsOnAStalledMasterBehindAnAbsentKey(t *testing.T) {
	_, admin, rdb := clusterClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const shards = 8
	s := stock.New(rdb, "stall", shards)
	for i := range shards {
		if _, err := s.Seed(ctx, i, 10, 1, stock.StateOpen, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.State(ctx); err != nil { // the slot map is loaded
		t.Fatal(err)
	}
	first, err := admin.MasterForKey(ctx, s.Keys(0).Meta())
	if err != nil {
		t.Fatal(err)
	}
	stalled := ""
	for i := 1; i < shards && stalled == ""; i++ {
		n, err := admin.MasterForKey(ctx, s.Keys(i).Meta())
		if err != nil {
			t.Fatal(err)
		}
		if n.Options().Addr != first.Options().Addr {
			stalled = n.Options().Addr
		}
	}
	if stalled == "" {
		t.Fatal("every shard on one master")
	}
	if err := admin.Del(ctx, s.Keys(0).Stock()).Err(); err != nil {
		t.Fatal(err)
	}
	// Longer than the client's read timeout and its retries.
	if err := redisOn(stalled).Do(ctx, "CLIENT", "PAUSE", 8000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testharness.Eventually(t, 20*time.Second, "the paused master answering", func() bool {
			return redisOn(stalled).Ping(context.Background()).Err() == nil
		})
	})
	states, err := s.State(ctx)
	if err == nil {
		t.Fatalf("State answered %+v while master %s did not answer; want an error", states, stalled)
	}
}

// clusterClients starts a Redis Cluster, with an admin client and a client
// configured as the operator's processes configure theirs; the test's end
// closes both.
func clusterClients(t *testing.T) (*testharness.RedisCluster, *redis.ClusterClient, redis.UniversalClient) {
	t.Helper()
	c := testharness.RedisClusterT(t)
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	rdb := config.Redis{Mode: config.RedisCluster, Addresses: c.Addrs()}.Client()
	t.Cleanup(func() { _ = admin.Close(); _ = rdb.Close() })
	return c, admin, rdb
}
