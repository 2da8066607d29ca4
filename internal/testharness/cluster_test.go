package testharness

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	stockKey = "{fs:abc:1}:stock"
	metaKey  = "{fs:abc:1}:meta"
)

// reserveScript takes one unit from the stock key and counts it in the meta
// hash, both in the same hash tag, so the pair changes atomically.
const reserveScript = `
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
if stock <= 0 then return -1 end
redis.call('DECR', KEYS[1])
redis.call('HINCRBY', KEYS[2], 'reserved', 1)
return stock - 1`

func newClusterClient(t *testing.T, c *RedisCluster) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func checkClusterShape(t *testing.T, c *RedisCluster, cc *redis.ClusterClient) {
	t.Helper()
	ctx := context.Background()
	// CLUSTER SLOTS is the map go-redis's ClusterClient routes by.
	slots, err := cc.ClusterSlots(ctx).Result() //nolint:staticcheck // see above
	if err != nil {
		t.Fatal(err)
	}
	covered, masters := 0, map[string]bool{}
	for _, s := range slots {
		covered += s.End - s.Start + 1
		if len(s.Nodes) != 1 {
			t.Errorf("slots %d-%d served by %d nodes, want 1 master and no replica", s.Start, s.End, len(s.Nodes))
		}
		masters[s.Nodes[0].Addr] = true
	}
	if covered != 16384 || len(masters) != 3 {
		t.Fatalf("cluster covers %d slots with %d masters (%v), want 16384 with 3", covered, len(masters), masters)
	}
	for _, addr := range c.Addrs() {
		if !masters[addr] {
			t.Errorf("node %s serves no slots", addr)
		}
		info, err := redisCmd(addr, "CLUSTER", "INFO")
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			t.Errorf("CLUSTER INFO on %s: %v\n%s", addr, err, info)
		}
	}
}

func TestRedisCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := RedisClusterT(t)
	if n := len(c.Addrs()); n != 3 {
		t.Fatalf("Addrs() has %d nodes, want 3", n)
	}
	cc := newClusterClient(t, c)
	checkClusterShape(t, c, cc)

	// One script, two keys of one hash tag, many concurrent callers: exactly
	// the stock is handed out and the meta counter agrees.
	const stock, buyers = 20, 50
	if err := cc.Set(ctx, stockKey, stock, 0).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make(chan int64, buyers)
	for range buyers {
		wg.Go(func() {
			n, err := cc.Eval(ctx, reserveScript, []string{stockKey, metaKey}).Int64()
			if err != nil {
				t.Error(err)
			}
			results <- n
		})
	}
	wg.Wait()
	close(results)
	got, left := 0, map[int64]bool{}
	for n := range results {
		if n >= 0 {
			got++
			if left[n] {
				t.Errorf("two reservations both left %d units", n)
			}
			left[n] = true
		}
	}
	if got != stock {
		t.Fatalf("%d reservations succeeded, want %d", got, stock)
	}
	if v, err := cc.Get(ctx, stockKey).Int(); err != nil || v != 0 {
		t.Fatalf("stock = %d, %v; want 0", v, err)
	}
	if v, err := cc.HGet(ctx, metaKey, "reserved").Int(); err != nil || v != stock {
		t.Fatalf("meta reserved = %d, %v; want %d", v, err, stock)
	}

	// Keys of two different slots in one script are refused.
	other := "{fs:xyz:2}:stock"
	s1, _ := cc.ClusterKeySlot(ctx, stockKey).Result()
	s2, _ := cc.ClusterKeySlot(ctx, other).Result()
	if s1 == s2 {
		t.Fatalf("test keys share slot %d", s1)
	}
	err := cc.Eval(ctx, reserveScript, []string{stockKey, other}).Err()
	if err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
		t.Fatalf("cross-slot EVAL: %v, want CROSSSLOT", err)
	}

	if err := c.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	cc2 := newClusterClient(t, c)
	checkClusterShape(t, c, cc2)
	for _, k := range []string{stockKey, metaKey} {
		if err := cc2.Get(ctx, k).Err(); err != redis.Nil && !strings.HasPrefix(errString(err), "WRONGTYPE") {
			t.Fatalf("GET %s after RestartEmpty: %v, want redis.Nil", k, err)
		}
		if n, err := cc2.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Fatalf("EXISTS %s after RestartEmpty = %d, %v; want 0", k, n, err)
		}
	}
	if err := cc2.Set(ctx, stockKey, 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := cc2.Eval(ctx, reserveScript, []string{stockKey, metaKey}).Int64(); err != nil || n != 0 {
		t.Fatalf("EVAL after RestartEmpty = %d, %v; want 0", n, err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// A cluster with replicas: Failover promotes the replica of a slot's master,
// and clients find the new master.
func TestRedisClusterFailover(t *testing.T) {
	c := RedisClusterWithReplicasT(t)
	if len(c.Nodes()) != 6 {
		t.Fatalf("%d nodes, want 3 masters and 3 replicas", len(c.Nodes()))
	}
	cc := newClusterClient(t, c)
	ctx := context.Background()
	if err := cc.Set(ctx, stockKey, 7, 0).Err(); err != nil {
		t.Fatal(err)
	}
	slot := int(cc.ClusterKeySlot(ctx, stockKey).Val())
	before, err := c.masterOf(slot)
	if err != nil {
		t.Fatal(err)
	}
	promoted, err := c.Failover(slot)
	if err != nil {
		t.Fatal(err)
	}
	if promoted == before {
		t.Fatalf("%s is still the master of slot %d", before.Addr(), slot)
	}
	cc.ReloadState(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := cc.MasterForKey(ctx, stockKey)
		if err == nil && m.Options().Addr == promoted.Addr() {
			if v, err := m.Get(ctx, stockKey).Int(); err != nil || v != 7 {
				t.Fatalf("the promoted replica has %v, %v", v, err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client still sees %v (%v) as the master", m, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRedisClusterMoveSlot(t *testing.T) {
	c := RedisClusterT(t)
	cc := newClusterClient(t, c)
	ctx := context.Background()
	if err := cc.Set(ctx, stockKey, 7, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := cc.HSet(ctx, metaKey, "reserved", 2).Err(); err != nil {
		t.Fatal(err)
	}
	slot := int(cc.ClusterKeySlot(ctx, stockKey).Val())
	before, err := c.masterOf(slot)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MoveSlot(slot, before); err == nil || !strings.Contains(err.Error(), "already serves") {
		t.Fatalf("moving a slot to its own master: %v", err)
	}
	to := c.Nodes()[0]
	if to == before {
		to = c.Nodes()[1]
	}
	if err := c.MoveSlot(slot, to); err != nil {
		t.Fatal(err)
	}
	if m, err := c.masterOf(slot); err != nil || m != to {
		t.Fatalf("slot %d is served by %v (%v), want %s", slot, m, err, to.Addr())
	}
	checkClusterShape(t, c, cc)
	// The keys moved with the slot: the new master has them, the old one none.
	direct := redis.NewClient(&redis.Options{Addr: to.Addr()})
	defer direct.Close()
	if v, err := direct.Get(ctx, stockKey).Int(); err != nil || v != 7 {
		t.Fatalf("the new master has stock %v, %v", v, err)
	}
	if n, err := redisCmd(before.Addr(), "CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(slot)); err != nil || n != "0" {
		t.Fatalf("the old master still has %s keys in the slot (%v)", n, err)
	}
	cc.ReloadState(ctx)
	if v, err := cc.HGet(ctx, metaKey, "reserved").Int(); err != nil || v != 2 {
		t.Fatalf("meta through the cluster client: %v, %v", v, err)
	}
}
