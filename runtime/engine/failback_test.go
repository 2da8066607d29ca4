package engine_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// replicate makes replica a replica of master and waits until it holds all of
// master's data.
func replicate(t *testing.T, replica, master redis.UniversalClient, masterAddr *testharness.Redis) {
	t.Helper()
	ctx := context.Background()
	if err := replica.Do(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(masterAddr.Port())).Err(); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 20*time.Second, "the replica in sync", func() bool {
		return testharness.InfoField(t, replica, "replication", "master_link_status") == "up" &&
			testharness.InfoField(t, replica, "replication", "master_sync_in_progress") == "0" &&
			testharness.InfoField(t, replica, "replication", "slave_repl_offset") == testharness.InfoField(t, master, "replication", "master_repl_offset")
	})
}

// promote makes c a master again (REPLICAOF NO ONE).
func promote(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	if err := c.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
}

// failback runs, on a, the failover and failback a master cut off from its
// replica b goes through when nothing watches: b is promoted (a still takes
// writes: lost, if any, with the failback), a rejoins as b's replica (a resync:
// it now holds b's copy) and is promoted back. In between, during b's term,
// lost runs on a.
func failback(t *testing.T, a, b *testharness.Redis, lost func()) {
	t.Helper()
	ca, cb := standaloneClient(t, a.Addr()), standaloneClient(t, b.Addr())
	replicate(t, cb, ca, a)
	promote(t, cb)
	lost()
	replicate(t, ca, cb, b)
	promote(t, ca)
}

// A master that loses a failover while it is cut off, rejoins as a replica of
// the promoted one and is promoted back keeps its run id and its script cache,
// but holds the replica's copy: older than the ledger by the reservations
// made on it during the replica's term. Its shard refuses from the first
// call, State reports it, and the rebuild counts the lost reservation. Before
// the shard's meta recorded its replication history, the failback sold the
// lost reservation's unit a second time.
func TestMasterPromotedBackIsRefusedUntilRebuilt(t *testing.T) {
	a, b := testharness.RedisT(t), testharness.RedisT(t)
	f := newFixture(t, standaloneClient(t, a.Addr()), withAllocation(1), withShards(1))
	failback(t, a, b, func() {
		if r := f.reserve("u-1", "r", 1); r.Outcome != engine.OutcomeReserved {
			t.Fatalf("the reserve during the replica's term: %+v", r)
		}
	})
	if r := f.reserve("u-2", "r", 1); r.Outcome != engine.OutcomeClosed || r.Reason != stock.ReasonUnverified {
		t.Fatalf("the first reserve after the failback: %+v, want CLOSED %s (the only unit is u-1's)", r, stock.ReasonUnverified)
	}
	ctx := context.Background()
	if h, err := f.e.Check(ctx, 1); err != nil || len(h.Unverified) != 1 {
		t.Fatalf("check after the failback: %+v %v", h, err)
	}
	if _, err := f.e.SeedSale(ctx, stock.StateOpen, answer(true)); !errors.Is(err, engine.ErrNeedsRebuild) {
		t.Fatalf("seed after the failback: %v, want ErrNeedsRebuild", err)
	}
	rep, err := f.e.Rebuild(ctx, openGate)
	if err != nil || rep.Reserved != 1 || rep.Available != 0 {
		t.Fatalf("rebuild: %+v %v", rep, err)
	}
	if r := f.reserve("u-2", "r", 1); r.Outcome != engine.OutcomeSoldOut {
		t.Fatalf("after the rebuild: %+v", r)
	}
	f.assertConserved()
}

// A failback during a rebuild leaves the master with the replica's copy of the
// rebuild's writes: the rebuild must not open it.
func TestRebuildDoesNotOpenAMasterPromotedBackDuringIt(t *testing.T) {
	a, b := testharness.RedisT(t), testharness.RedisT(t)
	f := newFixture(t, standaloneClient(t, a.Addr()), withAllocation(10), withShards(1))
	ctx := context.Background()
	f.reserve("u-1", "r", 1)
	_, err := f.e.RebuildWith(ctx, engine.RebuildOptions{Gate: openGate, BeforeFinish: func(int) {
		failback(t, a, b, func() {})
	}})
	if !errors.Is(err, engine.ErrServerChanged) {
		t.Fatalf("a rebuild across a failback: %v, want ErrServerChanged", err)
	}
	states, err := f.e.Store().State(ctx)
	if err != nil || states[0].State == stock.StateOpen {
		t.Fatalf("the shard after the rebuild: %+v %v", states, err)
	}
	if rep, err := f.e.Rebuild(ctx, openGate); err != nil || rep.Reserved != 1 || rep.Available != 9 {
		t.Fatalf("the rebuild after: %+v %v", rep, err)
	}
	f.assertConserved()
}

// In a cluster, a manual failover and the failover back (nothing lost, but
// the design cannot know) leave the shard refusing until it is rebuilt.
func TestClusterFailbackRefusedUntilRebuilt(t *testing.T) {
	c := testharness.RedisClusterWithReplicasT(t)
	rdb := clusterClient(t, c.Addrs())
	f := newFixture(t, rdb, withAllocation(40), withShards(4))
	ctx := context.Background()
	reserveMany(t, f, "early", 8)
	user := userHomedOn("buyer", 0, 4)
	slot := int(rdb.(*redis.ClusterClient).ClusterKeySlot(ctx, f.e.Store().Keys(0).Meta()).Val())
	master, err := c.Failover(slot)
	if err != nil {
		t.Fatal(err)
	}
	back, err := c.Failover(slot)
	if err != nil {
		t.Fatal(err)
	}
	if back == master {
		t.Fatal("the failback promoted the same node")
	}
	f.unverifiedUntilRebuilt(user, "the master promoted back")
	if n := f.assertConserved(); n.Reserved != 9 {
		t.Fatalf("counts %+v", n)
	}
}

// A master that takes its first replica starts a replication backlog under a
// new master_replid, with no promotion: its shards keep selling, and the new
// id is recorded, so that a failback later is still told apart.
func TestFirstReplicaIsNotAFailover(t *testing.T) {
	a, b := testharness.RedisT(t), testharness.RedisT(t)
	ca := standaloneClient(t, a.Addr())
	f := newFixture(t, ca, withAllocation(10), withShards(1))
	ctx := context.Background()
	before := testharness.InfoField(t, ca, "replication", "master_replid")
	replicate(t, standaloneClient(t, b.Addr()), ca, a)
	now := testharness.InfoField(t, ca, "replication", "master_replid")
	if now == before {
		t.Fatal("the first replica did not change the master's master_replid: the test shows nothing")
	}
	if states, err := f.e.Store().State(ctx); err != nil || states[0].Unverified {
		t.Fatalf("state with a first replica: %+v %v", states, err)
	}
	if r := f.reserve("u-1", "r", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatalf("reserve with a first replica: %+v", r)
	}
	if lin, err := ca.HGet(ctx, f.e.Store().Keys(0).Meta(), "lin").Result(); err != nil || lin != now {
		t.Fatalf("meta lin %q %v, want the new master_replid %s", lin, err, now)
	}
	f.assertConserved()
}
