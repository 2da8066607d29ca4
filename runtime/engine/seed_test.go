package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A ledger that does not know a sale Redis holds (its DSN now points at
// another database, or it lost data) is refused, and nothing is created in
// it: a second book at epoch 1 would let a later rebuild sell the sold units
// again. The same when the caller knows the sale was seeded before, even with
// Redis empty too.
func TestSeedRefusesALedgerThatDoesNotKnowTheSale(t *testing.T) {
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(10), withShards(2))
	reserveMany(t, f, "sold", 3)
	ctx := context.Background()
	other := func() (*engine.Engine, *ledger.Ledger) {
		l := newLedger(t, sharedPG)
		return openEngine(t, f.cfg, rdb, l), l
	}
	e, l := other()
	if _, err := e.Seed(ctx, stock.StateOpen); !errors.Is(err, engine.ErrLedgerMismatch) {
		t.Fatalf("seed on a ledger without the sale while Redis holds it: %v", err)
	}
	if _, err := l.GetCampaign(ctx, f.cfg.CampaignID); !errors.Is(err, ledger.ErrCampaignNotFound) {
		t.Fatalf("the other ledger got the campaign: %v", err)
	}
	if c := f.counts(); c.Reserved != 3 || c.Available != 7 {
		t.Fatalf("Redis changed: %+v", c)
	}

	empty := testharness.RedisT(t)
	f.cfg.CampaignID = "c-" + randomID()
	e, _ = other()
	e2 := openEngine(t, f.cfg, standaloneClient(t, empty.Addr()), l)
	if _, err := e2.SeedSale(ctx, stock.StateOpen, answer(true)); !errors.Is(err, engine.ErrLedgerMismatch) {
		t.Fatalf("seed of a sale seeded before, on an empty Redis and ledger: %v", err)
	}
	unsure := errors.New("cannot tell")
	ask := func(context.Context) (bool, error) { return false, unsure }
	if res, err := e.SeedSale(ctx, stock.StateOpen, ask); !errors.Is(err, unsure) || res.Seeded != 0 {
		t.Fatalf("seed when the caller cannot tell whether the sale ran: %+v %v", res, err)
	}
	if _, err := l.GetCampaign(ctx, f.cfg.CampaignID); !errors.Is(err, ledger.ErrCampaignNotFound) {
		t.Fatalf("the ledger got the campaign while the caller could not tell: %v", err)
	}
	if res, err := e.SeedSale(ctx, stock.StateOpen, answer(false)); err != nil || res.Seeded != 2 {
		t.Fatalf("a new sale: %+v %v", res, err)
	}
	// Asked only when neither store holds the campaign.
	asked := func(context.Context) (bool, error) {
		t.Fatal("asked with the campaign in the ledger")
		return false, nil
	}
	if res, err := e.SeedSale(ctx, stock.StateOpen, asked); err != nil || !res.Live {
		t.Fatalf("the seeded sale again: %+v %v", res, err)
	}
}

// answer is a caller's fixed answer to whether the sale was set up before.
func answer(yes bool) engine.SetUpBefore {
	return func(context.Context) (bool, error) { return yes, nil }
}

// TestSeedAfterLossIsARebuild: Redis lost a campaign's keys without restarting
// (a FLUSHALL, an eviction) while a reservation's ledger row was on its way.
// Seeding afresh at the same epoch would let that row commit against a full
// stock again; Seed refuses, and the rebuild counts the row.
func TestSeedAfterLossIsARebuild(t *testing.T) {
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(1), withShards(1))
	ctx := context.Background()
	// Hold the row: the group-commit statement share-locks the campaign row.
	tx, err := f.l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE`, f.cfg.CampaignID); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		r   engine.ReserveResult
		err error
	}
	first := make(chan answer, 1)
	go func() {
		r, err := f.e.Reserve(ctx, "first", "r", 1)
		first <- answer{r, err}
	}()
	testharness.Eventually(t, 5*time.Second, "the unit taken in Redis", func() bool { return f.counts().Reserved == 1 })

	keys, err := rdb.Keys(ctx, stock.ShardKeys(f.cfg.CampaignID, 0).Pattern()).Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("campaign keys %v: %v", keys, err)
	}
	if err := rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.Seed(ctx, stock.StateOpen); !errors.Is(err, engine.ErrNeedsRebuild) {
		t.Fatalf("seed after the loss must refuse: %v", err)
	}

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-first; a.err != nil || a.r.Outcome != engine.OutcomeReserved {
		t.Fatalf("the reservation in flight: %+v %v", a.r, a.err)
	}
	if _, err := f.e.Rebuild(ctx, openGate); err != nil {
		t.Fatal(err)
	}
	if r := f.reserve("second", "r", 1); r.Outcome != engine.OutcomeSoldOut {
		t.Fatalf("the only unit is reserved, a second buyer got %s", r.Outcome)
	}
	if c := f.assertConserved(); c.Reserved != 1 || c.Available != 0 {
		t.Fatalf("after the rebuild: %+v", c)
	}
}

// A Redis that may evict keys (maxmemory with a policy other than noeviction)
// gets nothing seeded or rebuilt: not the shards, not the ledger campaign,
// not a new epoch. Without maxmemory, no policy evicts.
func TestRedisThatMayEvictIsRefused(t *testing.T) {
	srv, err := testharness.StartRedisArgs("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	rdb := standaloneClient(t, srv.Addr())
	ctx := context.Background()
	l := newLedger(t, sharedPG)
	cfg := engine.Config{
		CampaignID: "c-" + randomID(), Namespace: "shop", Name: "drop", SKU: "itm-ps5-pro",
		Allocation: 100, Shards: 4, MaxPerUser: 1, TTL: time.Minute, StealProbes: 2,
		IDSecret: []byte("0123456789abcdef0123456789abcdef"),
	}
	e := openEngine(t, cfg, rdb, l)
	_, err = e.SeedSale(ctx, stock.StateOpen, answer(false))
	if !errors.Is(err, stock.ErrEvictionPolicy) || !strings.Contains(err.Error(), "allkeys-lru") || !strings.Contains(err.Error(), srv.Addr()) {
		t.Fatalf("seed on an evicting Redis: %v", err)
	}
	if n, _ := rdb.DBSize(ctx).Result(); n != 0 {
		t.Fatalf("%d keys written", n)
	}
	if _, err := l.GetCampaign(ctx, cfg.CampaignID); !errors.Is(err, ledger.ErrCampaignNotFound) {
		t.Fatalf("ledger campaign created: %v", err)
	}

	config := func(k, v string) {
		t.Helper()
		if err := rdb.ConfigSet(ctx, k, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	config("maxmemory-policy", "noeviction")
	if _, err := e.SeedSale(ctx, stock.StateOpen, answer(false)); err != nil {
		t.Fatalf("seed with noeviction: %v", err)
	}
	config("maxmemory-policy", "volatile-lru")
	if err := e.Store().CheckEviction(ctx); !errors.Is(err, stock.ErrEvictionPolicy) {
		t.Fatalf("volatile-lru: %v", err)
	}
	// A live sale that lost a shard there (evicted, or a master restarted
	// empty) must still fail closed, not stop at the policy.
	if err := rdb.Del(ctx, e.Store().Keys(2).Meta()).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.SeedSale(ctx, stock.StateOpen, answer(true)); !errors.Is(err, engine.ErrNeedsRebuild) {
		t.Fatalf("a live sale with a shard lost on an evicting Redis: %v, want ErrNeedsRebuild", err)
	}
	if _, err := e.Rebuild(ctx, openGate); !errors.Is(err, stock.ErrEvictionPolicy) {
		t.Fatalf("rebuild on an evicting Redis: %v", err)
	}
	if c, err := l.GetCampaign(ctx, cfg.CampaignID); err != nil || c.Epoch != 1 {
		t.Fatalf("campaign after a refused rebuild: %+v, %v", c, err)
	}
	config("maxmemory", "0")
	if err := e.Store().CheckEviction(ctx); err != nil {
		t.Fatalf("no maxmemory: %v", err)
	}
}

// A shard failed closed opens again only through a rebuild: when the loss's
// record did not reach the ledger (it did not answer), Seed still says a
// rebuild is needed, instead of the sale being reopened on the data the loss
// made suspect (a failback may since have made it look verified).
func TestSeedOfAFailedClosedShardIsARebuild(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(4), withShards(2))
	ctx := context.Background()
	f.reserve("u", "r", 1)
	if err := f.e.FailClose(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.Seed(ctx, stock.StateOpen); !errors.Is(err, engine.ErrNeedsRebuild) || !errors.Is(err, engine.ErrFailedClosed) {
		t.Fatalf("seed of failed-closed shards: %v, want ErrNeedsRebuild", err)
	}
	if _, err := f.e.Rebuild(ctx, openGate); err != nil {
		t.Fatal(err)
	}
	if res, err := f.e.Seed(ctx, stock.StateOpen); err != nil || !res.Live {
		t.Fatalf("seed after the rebuild: %+v %v", res, err)
	}
}
