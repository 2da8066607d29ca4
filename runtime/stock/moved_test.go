package stock_test

import (
	"context"
	"strconv"
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
// cluster client sends it on to the new master, where it runs once. The
// same for a release in a sweeper's pipeline, which goes to the master the
// client's slot map names, and then on its own.
func TestScriptFollowsMoved(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	for _, release := range []struct {
		name string
		run  func(ctx context.Context, s *stock.Store, l stock.Listed) (stock.ReleaseResult, error)
	}{
		{"alone", func(ctx context.Context, s *stock.Store, _ stock.Listed) (stock.ReleaseResult, error) {
			return s.Release(ctx, 0, key)
		}},
		{"pipelined", func(ctx context.Context, s *stock.Store, l stock.Listed) (stock.ReleaseResult, error) {
			res, errs := s.ReleaseEach(ctx, 0, []stock.Listed{l})
			return res[0], errs[0]
		}},
	} {
		t.Run(release.name, func(t *testing.T) {
			releaseAfterMove(t, release.run)
		})
	}
}

func releaseAfterMove(t *testing.T, release func(ctx context.Context, s *stock.Store, l stock.Listed) (stock.ReleaseResult, error)) {
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
	// As a sweep lists it, before the move.
	listed, err := setup.Expired(ctx, 0, time.Now().Add(time.Hour).UnixMilli(), 0, 1)
	if err != nil || len(listed) != 1 || listed[0].Key != key {
		t.Fatalf("listed %v (%v), want the reservation %s", listed, err, key)
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
	res, err := release(ctx, s, listed[0])
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

// A rebuild that starts on a slot being migrated to another master keeps
// the shard's meta (closed, REBUILDING, with the sale's schedule): Redis
// refuses a script's write to a key the script deleted on such a slot, and
// rebuild_begin used to delete the meta and write it anew, so it stopped
// halfway with the meta gone and the schedule with it.
func TestRebuildBeginOnAMigratingSlotKeepsTheMeta(t *testing.T) {
	c, admin, rdb := clusterClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := stock.New(rdb, "rebuild-migrating", 1)
	if _, err := s.Seed(ctx, 0, 10, 1, stock.StateOpen, 0); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if _, err := s.SetWindow(ctx, time.Time{}, end); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Reserve(ctx, stock.ReserveRequest{Shard: 0, Home: 0, Mode: stock.ModeHome, User: "u", Key: "k1", Quantity: 1, MaxPerUser: 1, TTL: time.Minute}); err != nil || r.Code != stock.Reserved {
		t.Fatalf("reserve: %+v %v", r, err)
	}
	k := s.Keys(0)
	if err := admin.ZAdd(ctx, k.Claims(), redis.Z{Score: 1, Member: "x"}).Err(); err != nil { // every declared key present
		t.Fatal(err)
	}
	slot, err := admin.ClusterKeySlot(ctx, k.Meta()).Result()
	if err != nil {
		t.Fatal(err)
	}
	src, err := admin.MasterForKey(ctx, k.Meta())
	if err != nil {
		t.Fatal(err)
	}
	from := redisOn(src.Options().Addr)
	var to *redis.Client
	for _, n := range c.Nodes() {
		if n.Addr() != src.Options().Addr {
			to = redisOn(n.Addr())
			break
		}
	}
	fromID, err := from.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	toID, err := to.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	if err := to.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := from.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = from.Do(context.Background(), "CLUSTER", "SETSLOT", slot, "NODE", fromID).Err()
		_ = to.Do(context.Background(), "CLUSTER", "SETSLOT", slot, "NODE", fromID).Err()
	})
	if err := s.RebuildBegin(ctx, 0, 2); err != nil {
		t.Fatalf("rebuild begin on a migrating slot: %v", err)
	}
	meta, err := from.HGetAll(ctx, k.Meta()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if meta["state"] != stock.StateRebuilding || meta["epoch"] != "2" || meta["we"] != strconv.FormatInt(end.UnixMilli(), 10) || meta["alloc"] != "" {
		t.Fatalf("the meta after rebuild begin: %v; want REBUILDING at epoch 2, the schedule kept and the data's fields gone", meta)
	}
}
