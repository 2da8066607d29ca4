package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A shard whose meta names another server (what a replica promoted by a
// failover carries: the meta its old master wrote) refuses until rebuilt, and
// Check reports it.
func TestShardFromAnotherServerRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(20), withShards(2), withSteal(0))
		ctx := context.Background()
		if err := rdb.HSet(ctx, f.e.Store().Keys(1).Meta(), "srv", "0123456789abcdef0123456789abcdef01234567").Err(); err != nil {
			t.Fatal(err)
		}
		h, err := f.e.Check(ctx, 1)
		if err != nil || len(h.Unverified) != 1 || h.Unverified[0] != 1 {
			t.Fatalf("check %+v %v", h, err)
		}
		var refused, taken int
		for i := range 20 {
			switch r := f.reserve(fmt.Sprintf("u-%d", i), "r", 1); {
			case r.Outcome == engine.OutcomeClosed && r.Reason == stock.ReasonUnverified:
				refused++
			case r.Outcome == engine.OutcomeReserved && r.Reservation.Shard == 0:
				taken++
			default:
				t.Fatalf("%+v", r)
			}
		}
		if refused == 0 || taken == 0 {
			t.Fatalf("refused %d, taken %d: both shards should have been tried", refused, taken)
		}
		if _, err := f.e.Rebuild(ctx, openGate); err != nil {
			t.Fatal(err)
		}
		if h, err := f.e.Check(ctx, 2); err != nil || h.Lost() {
			t.Fatalf("after the rebuild: %+v %v", h, err)
		}
		f.assertConserved()
	})
}

// userHomedOn is the first user "<prefix>-N" whose home is shard.
func userHomedOn(prefix string, shard, shards int) string {
	for i := 0; ; i++ {
		if u := fmt.Sprintf("%s-%d", prefix, i); stock.HomeShard(u, shards) == shard {
			return u
		}
	}
}

// unverifiedUntilRebuilt checks what a shard 0 now held by another server
// process (named where) does: user's first reserve that gets an answer is
// refused as UNVERIFIED, Check reports shard 0, and after a rebuild the same
// request is reserved. It returns Check's report.
func (f *fixture) unverifiedUntilRebuilt(user, where string) engine.Health {
	f.t.Helper()
	ctx := context.Background()
	var res engine.ReserveResult
	testharness.Eventually(f.t, 20*time.Second, "an answer from "+where, func() bool {
		var err error
		res, err = f.e.Reserve(ctx, user, "r", 1)
		return err == nil
	})
	if res.Outcome != engine.OutcomeClosed || res.Reason != stock.ReasonUnverified {
		f.t.Fatalf("the first reserve on %s: %+v", where, res)
	}
	h, err := f.e.Check(ctx, 1)
	if err != nil || !slices.Contains(h.Unverified, 0) {
		f.t.Fatalf("check %+v %v", h, err)
	}
	if _, err := f.e.Rebuild(ctx, openGate); err != nil {
		f.t.Fatal(err)
	}
	if res := f.reserve(user, "r", 1); res.Outcome != engine.OutcomeReserved {
		f.t.Fatalf("after the rebuild: %+v", res)
	}
	return h
}

// A replica promoted by a cluster failover carries the meta its old master
// wrote: its shards refuse from the first call that reaches it, even though
// this failover lost nothing (the design cannot know), and the rebuild opens
// them again.
func TestFailoverRefusedUntilRebuilt(t *testing.T) {
	c := testharness.RedisClusterWithReplicasT(t)
	rdb := clusterClient(t, c.Addrs())
	f := newFixture(t, rdb, withAllocation(40), withShards(4))
	ctx := context.Background()
	reserveMany(t, f, "early", 8)
	user := userHomedOn("buyer", 0, 4)
	slot := int(rdb.(*redis.ClusterClient).ClusterKeySlot(ctx, f.e.Store().Keys(0).Meta()).Val())
	if _, err := c.Failover(slot); err != nil {
		t.Fatal(err)
	}
	f.unverifiedUntilRebuilt(user, "the promoted replica")
	if n := f.assertConserved(); n.Reserved != 9 {
		t.Fatalf("counts %+v", n)
	}
}

// A resharding that moves a live shard's slot to another master while buyers
// keep reserving carries the shard's meta there, stamped by the old master: the
// shard refuses (UNVERIFIED) until it is rebuilt, nothing is oversold, and the
// rebuild gives back exactly the ledger's counts.
func TestReshardRefusedUntilRebuilt(t *testing.T) {
	c := testharness.RedisClusterT(t)
	rdb := clusterClient(t, c.Addrs())
	f := newFixture(t, rdb, withAllocation(400), withShards(4))
	ctx := context.Background()
	reserveMany(t, f, "early", 8)
	user := userHomedOn("buyer", 0, 4)

	// Buyers on every shard while the slot moves; errors (the moving shard's
	// TRYAGAIN and ASK answers) are refusals.
	var acked atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := f.e.Reserve(ctx, fmt.Sprintf("during-%d-%d", g, i), "r", 1)
				if err == nil && r.Outcome == engine.OutcomeReserved {
					acked.Add(1)
				}
			}
		})
	}
	slot := int(rdb.(*redis.ClusterClient).ClusterKeySlot(ctx, f.e.Store().Keys(0).Meta()).Val())
	moved := false
	for _, n := range c.Nodes() {
		if err := c.MoveSlot(slot, n); err == nil {
			moved = true
			break
		} else if !strings.Contains(err.Error(), "already serves") {
			close(stop)
			wg.Wait()
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if !moved {
		t.Fatal("the slot did not move")
	}
	t.Logf("%d reservations acknowledged while the slot moved", acked.Load())
	f.assertNoOversell()

	if h := f.unverifiedUntilRebuilt(user, "the new master"); len(h.Unverified) != 1 {
		t.Fatalf("only the moved shard should be unverified: %+v", h)
	}
	want := 8 + acked.Load() + 1
	if n := f.assertConserved(); n.Reserved != want || n.Available != 400-want {
		t.Fatalf("counts %+v, want %d reserved", n, want)
	}
}

// The run ids the controller compares are those of the servers holding the
// sale's shards: in a shared cluster a restart or a new master elsewhere is not
// this sale's data loss and must not close it for a rebuild.
func TestRunIDsAreTheShardsServers(t *testing.T) {
	rdb := clusterClient(t, sharedCluster.Addrs())
	f := newFixture(t, rdb, withAllocation(10), withShards(1))
	ctx := context.Background()
	master, err := rdb.(*redis.ClusterClient).MasterForKey(ctx, f.e.Store().Keys(0).Meta())
	if err != nil {
		t.Fatal(err)
	}
	h, err := f.e.Check(ctx, 1)
	if err != nil || h.Lost() {
		t.Fatalf("check: %+v, %v", h, err)
	}
	if len(h.RunIDs) != 1 || h.RunIDs[master.Options().Addr] == "" {
		t.Fatalf("run ids %v, want only the shard's master %s (of %d masters)", h.RunIDs, master.Options().Addr, len(sharedCluster.Addrs()))
	}
}
