package engine_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	reservecmd "github.com/flashsale-dev/flashsale-operator/internal/cmd/reserve"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Shared servers, started once for the package. Tests that kill or empty a server
// start their own.
var (
	sharedRedis   *testharness.Redis
	sharedCluster *testharness.RedisCluster
	sharedPG      *testharness.Postgres
)

func TestMain(m *testing.M) {
	testharness.Main(m, func() (err error) {
		if sharedRedis, err = testharness.StartRedis(); err != nil {
			return err
		}
		if sharedCluster, err = testharness.StartRedisCluster(); err != nil {
			return err
		}
		sharedPG, err = testharness.StartPostgres()
		return err
	})
}

// backend is one kind of Redis deployment the engine must work on.
type backend struct {
	name   string
	client func(t *testing.T) redis.UniversalClient
}

func backends() []backend {
	return []backend{
		{"standalone", func(t *testing.T) redis.UniversalClient { return standaloneClient(t, sharedRedis.Addr()) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return clusterClient(t, sharedCluster.Addrs()) }},
	}
}

func standaloneClient(t *testing.T, addr string) redis.UniversalClient {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func clusterClient(t *testing.T, addrs []string) redis.UniversalClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// forEachBackend runs a test on standalone Redis and on the Redis Cluster.
func forEachBackend(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { f(t, b.client(t)) })
	}
}

// fixture is one campaign on a fresh ledger database.
type fixture struct {
	t   testing.TB
	e   *engine.Engine
	l   *ledger.Ledger
	rdb redis.UniversalClient
	cfg engine.Config
	pg  *testharness.Postgres
}

// fixtureConfig is what a fixture's options set: the engine's configuration
// and its group-commit writer's.
type fixtureConfig struct {
	engine.Config
	mat ledger.MaterializerConfig
}

type option func(*fixtureConfig)

func withAllocation(n int64) option { return func(c *fixtureConfig) { c.Allocation = n } }
func withShards(n int) option       { return func(c *fixtureConfig) { c.Shards = n } }
func withMaxPerUser(n int) option   { return func(c *fixtureConfig) { c.MaxPerUser = n } }
func withTTL(ttl, grace time.Duration) option {
	return func(c *fixtureConfig) { c.TTL, c.Grace = ttl, grace }
}
func withSteal(n int) option { return func(c *fixtureConfig) { c.StealProbes = n } }
func withSettleStuckAfter(d time.Duration) option {
	return func(c *fixtureConfig) { c.SettleStuckAfter = d }
}
func withClaimSlack(d time.Duration) option {
	return func(c *fixtureConfig) { c.ClaimSlack = d }
}
func withBackstop(d time.Duration) option { return func(c *fixtureConfig) { c.Backstop = d } }
func withRand(src mrand.Source) option    { return func(c *fixtureConfig) { c.Rand = src } }
func withMaterializer(mc ledger.MaterializerConfig) option {
	return func(c *fixtureConfig) { c.mat = mc }
}

func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newFixture(t testing.TB, rdb redis.UniversalClient, opts ...option) *fixture {
	return newFixtureOn(t, rdb, sharedPG, opts...)
}

func newFixtureOn(t testing.TB, rdb redis.UniversalClient, pg *testharness.Postgres, opts ...option) *fixture {
	t.Helper()
	fc := fixtureConfig{Config: engine.Config{
		CampaignID: "c-" + randomID(), Namespace: "shop", Name: "drop", SKU: "itm-ps5-pro",
		Allocation: 100, Shards: 4, MaxPerUser: 1, TTL: time.Minute, Grace: 0, StealProbes: 2,
		IDSecret: []byte("0123456789abcdef0123456789abcdef"),
	}}
	for _, o := range opts {
		o(&fc)
	}
	cfg := withTestPipeline(fc.Config)
	l := newLedger(t, pg)
	e, err := engine.New(cfg, rdb, l, fc.mat)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	f := &fixture{t: t, e: e, l: l, rdb: rdb, cfg: cfg, pg: pg}
	if _, err := e.Seed(context.Background(), stock.StateOpen); err != nil {
		t.Fatal(err)
	}
	return f
}

// newLedger opens a ledger on a fresh database of pg, closed at the end.
func newLedger(t testing.TB, pg *testharness.Postgres) *ledger.Ledger {
	t.Helper()
	dsn, err := pg.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// ledgerThroughProxy opens the fixture's ledger database again through a
// fault proxy of its own (another process's connections, which the test can
// cut or stall), with params added to the DSN; closed at the end.
func (f *fixture) ledgerThroughProxy(params string) (*ledger.Ledger, *testharness.FaultProxy) {
	f.t.Helper()
	cc := f.l.Pool().Config().ConnConfig
	proxy := testharness.FaultProxyT(f.t, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	l, err := ledger.Open(context.Background(), fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable%s", cc.User, proxy.Addr(), cc.Database, params))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(l.Close)
	return l, proxy
}

// openEngine is another engine on a campaign's Redis and ledger (another
// process, or the same one after a configuration change), closed at the end.
func openEngine(t testing.TB, cfg engine.Config, rdb redis.UniversalClient, l *ledger.Ledger) *engine.Engine {
	t.Helper()
	e, err := engine.New(withTestPipeline(cfg), rdb, l, ledger.MaterializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// envTestReservePipeline, set to a batch size, runs the engines of these
// tests with their reserve calls batched into pipelines of that size, two in
// flight as reserve pods run them (envTestReservePipelines changes that).
const (
	envTestReservePipeline  = "FLASHSALE_TEST_RESERVE_PIPELINE"
	envTestReservePipelines = "FLASHSALE_TEST_RESERVE_PIPELINES"
)

func withTestPipeline(c engine.Config) engine.Config {
	if n, err := strconv.Atoi(os.Getenv(envTestReservePipeline)); err == nil && c.Pipeline == (stock.PipelineConfig{}) {
		inFlight, err := strconv.Atoi(os.Getenv(envTestReservePipelines))
		if err != nil {
			inFlight = reservecmd.DefaultReservePipelines
		}
		c.Pipeline = stock.PipelineConfig{MaxBatch: n, InFlight: inFlight}
	}
	return c
}

func (f *fixture) counts() engine.Counts {
	f.t.Helper()
	c, err := f.e.Counts(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// redisHeld reads, per shard, the units Redis holds in RESERVED reservations
// from the reservation hashes themselves (found by scanning the keys, not
// through the expiry index or the counters), and fails when a RESERVED hash is
// missing from the expiry index: the sweeper would never release its unit.
func (f *fixture) redisHeld() (reservedUnits []int64) {
	f.t.Helper()
	ctx := context.Background()
	s := f.e.Store()
	reservedUnits = make([]int64, s.Shards())
	for i := range reservedUnits {
		k := s.Keys(i)
		for _, hashKey := range scanKeys(f.t, f.rdb, k.ResPrefix()+"*") {
			key := strings.TrimPrefix(hashKey, k.ResPrefix())
			r, ok, err := s.GetReservation(ctx, i, key)
			if err != nil {
				f.t.Fatal(err)
			}
			if !ok || r.Status != stock.ResReserved {
				continue
			}
			reservedUnits[i] += int64(r.Quantity)
			if err := f.rdb.ZScore(ctx, k.Index(), key).Err(); err != nil {
				f.t.Fatalf("shard %d: RESERVED reservation %s is not in the expiry index (%v): its unit would never come back", i, key, err)
			}
		}
	}
	return reservedUnits
}

// scanKeys lists the keys matching pattern, on every master of a cluster.
func scanKeys(t testing.TB, rdb redis.UniversalClient, pattern string) []string {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var out []string
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			out = append(out, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		t.Fatalf("scanKeys: unsupported client %T", rdb)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// assertNoOversell checks I1 from both sides: committed ≤ allocation in the
// ledger, and no shard's stock holding a unit already committed.
func (f *fixture) assertNoOversell() engine.Counts {
	f.t.Helper()
	c := f.counts()
	if c.Sold > c.Allocation {
		f.t.Fatalf("I1 violated: %d units committed of %d", c.Sold, c.Allocation)
	}
	if err := c.StockOversold(); err != nil {
		f.t.Fatalf("I1 violated: %v", err)
	}
	return c
}

// assertConserved checks I2 at quiescence, per shard and in total, with the
// reserved units counted from the reservation hashes and cross-checked against
// the shards' counters and the ledger's PENDING units.
func (f *fixture) assertConserved() engine.Counts {
	f.t.Helper()
	c := f.assertNoOversell()
	held := f.redisHeld()
	for i, s := range c.Shards {
		if held[i] != s.Reserved {
			f.t.Fatalf("shard %d: the reserved counter says %d units, the RESERVED hashes hold %d", i, s.Reserved, held[i])
		}
		if s.Pending != s.Reserved {
			f.t.Fatalf("shard %d: ledger PENDING units %d != Redis reserved units %d", i, s.Pending, s.Reserved)
		}
	}
	if !c.Conserved() {
		f.t.Fatalf("I2 violated: available %d + reserved %d + sold %d != allocation %d (per shard: %+v)", c.Available, c.Reserved, c.Sold, c.Allocation, c.Shards)
	}
	return c
}

func (f *fixture) reserve(user, req string, qty int) engine.ReserveResult {
	f.t.Helper()
	r, err := f.e.Reserve(context.Background(), user, req, qty)
	if err != nil {
		f.t.Fatalf("reserve %s/%s: %v", user, req, err)
	}
	return r
}

func (f *fixture) sweepUntilQuiet() engine.SweepStats {
	f.t.Helper()
	var total engine.SweepStats
	for range 20 {
		st, err := f.e.Sweep(context.Background())
		if err != nil {
			f.t.Fatal(err)
		}
		total.Released += st.Released
		total.Committed += st.Committed
		total.Abandoned += st.Abandoned
		total.ReapedClaims += st.ReapedClaims
		if st.Released+st.Committed+st.Abandoned+st.Skipped+st.ReapedClaims == 0 {
			return total
		}
		time.Sleep(20 * time.Millisecond)
	}
	return total
}

type counter struct{ n atomic.Int64 }

func (c *counter) value() int64 { return c.n.Load() }

// openGate is a Rebuild gate that always answers OPEN.
func openGate() string { return stock.StateOpen }
