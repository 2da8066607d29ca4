package engine_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// On a Redis Cluster each shard is swept by its own master's clock: the one
// that wrote its expiries, paying marks and claims' times, read once per
// master and pass. A master that does not answer holds back its own shards
// only, and costs the pass its read timeout once, not once per shard.
func TestSweepReadsEachShardsOwnClock(t *testing.T) {
	t.Parallel()
	cluster := testharness.RedisClusterT(t) // its own: the test counts TIME calls and pauses a master
	// Read timeouts as production's client sets them (runtime/config), so a
	// stalled master fails its calls after a second, not the default three.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), PoolSize: 64,
		ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	const shards = 6
	campaign, onMaster := spreadCampaign(t, rdb, shards)
	f := newFixture(t, rdb, withShards(shards), withAllocation(600), withTTL(time.Second, 0),
		func(c *fixtureConfig) { c.CampaignID = campaign })
	for i := range 120 {
		f.reserve(fmt.Sprintf("buyer-%d", i), "r", 1)
	}
	time.Sleep(1200 * time.Millisecond)

	// One pass: each master answers TIME once, for all of its shards (six
	// shards on three masters: one holds two at least).
	before := timeCalls(t, onMaster)
	st, err := f.e.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after := timeCalls(t, onMaster)
	for addr, held := range onMaster {
		if got := after[addr] - before[addr]; got != 1 {
			t.Errorf("master %s (shards %v) answered TIME %d times in a pass, want 1", addr, held, got)
		}
	}
	if st.Released == 0 {
		t.Fatalf("the first pass released nothing: %+v", st)
	}

	// More expired reservations, then one master stalls for 3 s: a pass
	// whose calls to it time out after 1 s (and that gives up after 2.5 s)
	// has swept every other master's shards.
	for i := range 120 {
		f.reserve(fmt.Sprintf("buyer-%d", i), "r2", 1)
	}
	time.Sleep(1200 * time.Millisecond)
	stalled := mostShards(onMaster)
	want := reservedOnShards(t, f, onMaster, stalled)
	pauseClient := redis.NewClient(&redis.Options{Addr: stalled})
	defer pauseClient.Close()
	if err := pauseClient.Do(ctx, "CLIENT", "PAUSE", "3000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	pausedUntil := time.Now().Add(3 * time.Second)
	passCtx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	st, err = f.e.Sweep(passCtx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), stalled) {
		t.Fatalf("a pass with master %s stalled: %v; want an error naming it", stalled, err)
	}
	if want == 0 || st.Released != want {
		t.Fatalf("a pass with master %s (shards %v) stalled released %d, want the %d reservations of the other masters' shards (%v)",
			stalled, onMaster[stalled], st.Released, want, err)
	}
	time.Sleep(time.Until(pausedUntil) + 100*time.Millisecond)
	f.sweepUntilQuiet()
	if c := f.assertConserved(); c.Reserved != 0 {
		t.Fatalf("after the stall: %+v", c)
	}

	// The other masters' shards do not wait for the stalled one's clock:
	// with a client that waits 30 s for an answer and a master paused for
	// 8 s (a pause cannot be lifted early), their expired orders are
	// cancelled within 4 s.
	patient := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), PoolSize: 64,
		ReadTimeout: 30 * time.Second, WriteTimeout: time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = patient.Close() })
	e2 := openEngine(t, f.cfg, patient, f.l)
	if _, err := e2.Sweep(ctx); err != nil { // its slot map loaded before the stall
		t.Fatal(err)
	}
	for i := range 120 {
		f.reserve(fmt.Sprintf("buyer-%d", i), "r3", 1)
	}
	time.Sleep(1200 * time.Millisecond)
	var others []int
	for addr, held := range onMaster {
		if addr != stalled {
			others = append(others, held...)
		}
	}
	if pendingOn(t, f, others) == 0 {
		t.Fatalf("no order pending on the shards %v of the masters that do not stall", others)
	}
	if err := pauseClient.Do(ctx, "CLIENT", "PAUSE", "8000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	passDone := make(chan error, 1)
	go func() { _, err := e2.Sweep(ctx); passDone <- err }()
	deadline := time.Now().Add(4 * time.Second)
	for n := pendingOn(t, f, others); n != 0; n = pendingOn(t, f, others) {
		if time.Now().After(deadline) {
			passErr := <-passDone
			t.Fatalf("%v; the pass: %v", fmt.Sprintf("with master %s (shards %v) paused, %d orders of the other masters' shards %v were not swept in 4 s: they waited for its clock",
				stalled, onMaster[stalled], n, others), passErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := <-passDone; err != nil {
		t.Fatalf("the pass with the patient client, once the master answered: %v", err)
	}
	f.sweepUntilQuiet()
	if c := f.assertConserved(); c.Reserved != 0 {
		t.Fatalf("after the second stall: %+v", c)
	}
}

// mostShards is the master holding the most shards.
func mostShards(masters map[string][]int) string {
	var most string
	for addr, held := range masters {
		if most == "" || len(held) > len(masters[most]) || len(held) == len(masters[most]) && addr < most {
			most = addr
		}
	}
	return most
}

// pendingOn is the orders of f's sale still PENDING in the ledger on shards.
func pendingOn(t *testing.T, f *fixture, shards []int) int {
	t.Helper()
	var n int
	if err := f.l.Pool().QueryRow(context.Background(), `SELECT count(*) FROM flashsale_orders
WHERE campaign_id = $1 AND status = 'PENDING' AND shard = ANY ($2)`, f.cfg.CampaignID, shards).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// spreadCampaign finds a campaign id whose shards lie on at least two of the
// cluster's masters (the shards' slots come from the id), and says which
// shards each master holds.
func spreadCampaign(t *testing.T, rdb redis.UniversalClient, shards int) (string, map[string][]int) {
	t.Helper()
	cc := rdb.(*redis.ClusterClient)
	for n := range 100 {
		campaign := "c-sweep-clock-" + strconv.Itoa(n)
		s := stock.New(rdb, campaign, shards)
		onMaster := map[string][]int{}
		for i := range shards {
			node, err := cc.MasterForKey(context.Background(), s.Keys(i).Meta())
			if err != nil {
				t.Fatal(err)
			}
			onMaster[node.Options().Addr] = append(onMaster[node.Options().Addr], i)
		}
		if len(onMaster) >= 2 {
			return campaign, onMaster
		}
	}
	t.Fatal("no campaign id spreads its shards over two masters")
	return "", nil
}

var timeCallsRE = regexp.MustCompile(`(?m)^cmdstat_time:calls=(\d+),`)

// timeCalls is how many TIME commands each master has answered.
func timeCalls(t *testing.T, masters map[string][]int) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for addr := range masters {
		c := redis.NewClient(&redis.Options{Addr: addr})
		info, err := c.Info(context.Background(), "commandstats").Result()
		_ = c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if m := timeCallsRE.FindStringSubmatch(info); m != nil {
			out[addr], _ = strconv.ParseInt(m[1], 10, 64)
		}
	}
	return out
}

// reservedOnShards is the units reserved on the shards of every master but
// except.
func reservedOnShards(t *testing.T, f *fixture, masters map[string][]int, except string) int {
	t.Helper()
	states, err := f.e.Store().State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for addr, held := range masters {
		if addr == except {
			continue
		}
		for _, i := range held {
			n += int(states[i].Reserved)
		}
	}
	return n
}
