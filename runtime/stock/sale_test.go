package stock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// standalone starts a Redis for the test and returns it with a client that
// never re-sends a command.
func standalone(t *testing.T) (*testharness.Redis, *redis.Client) {
	t.Helper()
	r := testharness.RedisT(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: 64, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return r, rdb
}

// cluster starts a Redis Cluster for the test and returns it with a client.
func cluster(t *testing.T) (*testharness.RedisCluster, *redis.ClusterClient) {
	t.Helper()
	c := testharness.RedisClusterT(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	return c, rdb
}

// eachBackend runs a test on a standalone Redis and on a Redis Cluster of
// its own.
func eachBackend(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient)) {
	t.Run("standalone", func(t *testing.T) {
		_, rdb := standalone(t)
		f(t, rdb)
	})
	t.Run("cluster", func(t *testing.T) {
		_, rdb := cluster(t)
		f(t, rdb)
	})
}

// openSale seeds campaign with shards open shards of units each, at epoch 1,
// as a new sale is seeded.
func openSale(t *testing.T, rdb redis.UniversalClient, campaign string, shards int, units int64) *stock.Store {
	t.Helper()
	s := stock.New(rdb, campaign, shards)
	for i := range shards {
		if _, err := s.Seed(context.Background(), i, units, 1, stock.StateOpen, 0); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// reserveHome reserves one unit for user on its home shard, with a request
// key of its own.
func reserveHome(ctx context.Context, s *stock.Store, user string) (stock.ShardResult, error) {
	home := stock.HomeShard(user, s.Shards())
	return s.Reserve(ctx, stock.ReserveRequest{
		Shard: home, Home: home, Mode: stock.ModeHome, User: user, Key: "k-" + user,
		Quantity: 1, MaxPerUser: 1, TTL: time.Minute,
	})
}

// totals sums the shards' stock and reserved units.
func totals(t *testing.T, s *stock.Store) (available, reserved int64) {
	t.Helper()
	states, err := s.State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range states {
		available += st.Available
		reserved += st.Reserved
	}
	return available, reserved
}

// randomID names a campaign of one test run.
func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
