package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A steal that its target refused before running it (the target's slot being
// migrated: TRYAGAIN, since some of the call's keys are not there) did nothing
// there: the buyer's claim on the home shard goes back at once and the request
// is a 503 to retry, instead of the buyer held BUSY and at the limit until the
// reaper. Retried once the migration is abandoned, the same request is placed.
// Each call alone, and in pipelines.
func TestARefusedStealGivesTheClaimBack(t *testing.T) {
	for name, pipe := range map[string]stock.PipelineConfig{"alone": {}, "pipelined": {MaxBatch: 8, InFlight: 2}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := testharness.RedisClusterT(t)
			ctx := context.Background()
			rdb := config.Redis{Mode: config.RedisCluster, Addresses: c.Addrs()}.Client()
			t.Cleanup(func() { _ = rdb.Close() })
			f := newFixture(t, rdb, withAllocation(2), withShards(2), withSteal(1), withMaxPerUser(1),
				func(c *fixtureConfig) { c.Pipeline = pipe })
			f.reserve(userHomedOn("first", 0, 2), "r", 1) // shard 0 sold out

			// Shard 1's slot migrating to another master, its keys left where they are.
			cc := rdb.(*redis.ClusterClient)
			meta := f.e.Store().Keys(1).Meta()
			slot, err := cc.ClusterKeySlot(ctx, meta).Result()
			if err != nil {
				t.Fatal(err)
			}
			from, err := cc.MasterForKey(ctx, meta)
			if err != nil {
				t.Fatal(err)
			}
			var to *redis.Client
			var mu sync.Mutex // ForEachMaster calls on every master at once
			if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				mu.Lock()
				defer mu.Unlock()
				if m.Options().Addr != from.Options().Addr && to == nil {
					to = m
				}
				return nil
			}); err != nil || to == nil {
				t.Fatalf("another master: %v", err)
			}
			setSlot := func(node *redis.Client, args ...any) {
				t.Helper()
				if err := node.Do(ctx, append([]any{"CLUSTER", "SETSLOT", slot}, args...)...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			setSlot(to, "IMPORTING", from.ClusterMyID(ctx).Val())
			setSlot(from, "MIGRATING", to.ClusterMyID(ctx).Val())

			buyer := userHomedOn("buyer", 0, 2)
			r, err := f.e.Reserve(ctx, buyer, "r1", 1)
			if !errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), "TRYAGAIN") {
				t.Fatalf("a steal refused by a migrating slot: %+v %v, want unavailable (TRYAGAIN)", r, err)
			}
			users, err := rdb.HGetAll(ctx, f.e.Store().Keys(0).Users()).Result()
			if err != nil {
				t.Fatal(err)
			}
			for field, v := range users {
				if strings.HasPrefix(field, "p:") || field == buyer && v != "0" {
					t.Fatalf("the buyer's quota is still held on the home shard: %s=%s", field, v)
				}
			}

			// The migration abandoned: nothing moved.
			setSlot(to, "STABLE")
			setSlot(from, "STABLE")
			if r := f.reserve(buyer, "r1", 1); r.Reservation.Shard != 1 {
				t.Fatalf("the retry: %+v, want a reservation on shard 1", r)
			}
			f.assertConserved()
		})
	}
}
