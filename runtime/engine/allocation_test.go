package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Restock adds the delta exactly once, also when repeated or resumed.
// An allocation change meets a rebuild started by another operator (a
// leadership handover while one was mid-reconcile). The rebuild writes each
// shard from its own snapshot of the ledger, so a change applied under it
// would be undone (a restock lost for good) or miss it (a decrease whose
// withdrawn units the rebuild put back, then sold: an oversell). Such a change
// is refused, and applied once the rebuild is done.
func TestAllocationChangeDuringARebuildIsRefused(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(100), withShards(4))
	ctx := context.Background()
	reserveMany(t, f, "held", 10)
	camp, err := f.l.GetCampaign(ctx, f.cfg.CampaignID)
	if err != nil {
		t.Fatal(err)
	}
	// The other operator's rebuild has bumped the epoch; its shards are not written yet.
	if _, err := f.l.BeginRebuild(ctx, f.cfg.CampaignID, 0); err != nil {
		t.Fatal(err)
	}
	before := f.counts()
	if _, err := f.e.ApplyAllocation(ctx, 140); !errors.Is(err, stock.ErrRebuilt) {
		t.Fatalf("a restock during a rebuild: %v, want ErrRebuilt", err)
	}
	if c := f.counts(); c.Available != before.Available || c.Withdrawn != 0 {
		t.Fatalf("the refused restock changed the shards: %+v, before %+v", c, before)
	}
	// Units withdrawn under the old epoch cannot be recorded as a decrease.
	if _, _, err := f.e.Store().Withdraw(ctx, 0, camp.Epoch+1, 5); !errors.Is(err, stock.ErrRebuilt) {
		t.Fatalf("a withdrawal under the new epoch from a shard of the old: %v", err)
	}
	if _, err := f.l.RecordAllocationDecrease(ctx, f.cfg.CampaignID, camp.Epoch, 140, 120, []int64{-5, -5, -5, -5}); !errors.Is(err, ledger.ErrEpochChanged) {
		t.Fatalf("a decrease withdrawn under the old epoch: %v, want ErrEpochChanged", err)
	}
	// A decrease through the engine is refused too.
	if _, err := f.e.ApplyAllocation(ctx, 60); !errors.Is(err, stock.ErrRebuilt) {
		t.Fatalf("a decrease during a rebuild: %v, want ErrRebuilt", err)
	}
	// The rebuild done, the restock recorded meanwhile is applied once.
	f.restockAfterRebuild(140, 130)
}

// restockAfterRebuild finishes a rebuild, asks for the allocation target
// twice (the second call finds nothing to do) and checks the counts.
func (f *fixture) restockAfterRebuild(target, available int64) {
	f.t.Helper()
	ctx := context.Background()
	if _, err := f.e.Rebuild(ctx, openGate); err != nil {
		f.t.Fatal(err)
	}
	for range 2 {
		if _, err := f.e.ApplyAllocation(ctx, target); err != nil {
			f.t.Fatal(err)
		}
	}
	if c := f.assertConserved(); c.Allocation != target || c.Available != available {
		f.t.Fatalf("counts after the rebuild and the restock: %+v", c)
	}
}

// A restock planned after another operator's rebuild took its snapshot, by
// an engine that read the epoch before the rebuild began, must not reach the
// shards the rebuild has not rewritten yet: the rebuild would overwrite them,
// and the change, marked applied, would never be in Redis.
func TestRestockPlannedAfterARebuildSnapshot(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(100), withShards(4))
	ctx := context.Background()
	reserveMany(t, f, "held", 10)
	before := f.counts()
	lock, err := pgx.ConnectConfig(ctx, f.l.Pool().Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(ctx)
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The engine reads the epoch, then waits for this lock to list the
	// changes; the rebuild bumps the epoch, then waits for it to absorb them.
	if _, err := tx.Exec(ctx, `LOCK TABLE flashsale_allocation_changes IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	dsn := f.l.Pool().Config().ConnString()
	applied := make(chan error, 1)
	go func() {
		_, err := f.e.ApplyAllocation(ctx, 140)
		applied <- err
	}()
	testharness.WaitForLockWaiters(t, dsn, 1, 30*time.Second, "the restock waiting to list the changes")
	rebuilt := make(chan error, 1)
	go func() {
		_, err := f.l.BeginRebuild(ctx, f.cfg.CampaignID, 0)
		rebuilt <- err
	}()
	testharness.WaitForLockWaiters(t, dsn, 2, 30*time.Second, "the rebuild waiting to absorb the changes")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-rebuilt; err != nil {
		t.Fatal(err)
	}
	if err := <-applied; !errors.Is(err, stock.ErrRebuilt) {
		t.Fatalf("a restock planned after the rebuild's snapshot, on shards of the old epoch: %v, want ErrRebuilt", err)
	}
	if c := f.counts(); c.Available != before.Available {
		t.Fatalf("the refused restock changed the shards: %+v, before %+v", c, before)
	}
	// The rebuild done, the restock is in Redis once.
	f.restockAfterRebuild(140, 130)
}

// A decrease that finds units withdrawn on a shard the rebuild has not
// rewritten yet (an earlier attempt's, pending) must not record them: the
// rebuild drops that withdrawal and the units come back into stock.
func TestDecreaseDoesNotCountWithdrawalsARebuildDrops(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(100), withShards(4))
	ctx := context.Background()
	camp, err := f.l.GetCampaign(ctx, f.cfg.CampaignID)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.e.Store().Withdraw(ctx, 0, camp.Epoch, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := f.l.BeginRebuild(ctx, f.cfg.CampaignID, 0); err != nil {
		t.Fatal(err)
	}
	// Shards 1–3 already rewritten by the rebuild; shard 0 waits its turn.
	for shard := 1; shard < 4; shard++ {
		if err := f.rdb.HSet(ctx, f.e.Store().Keys(shard).Meta(), "epoch", camp.Epoch+1).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.e.ApplyAllocation(ctx, 80); !errors.Is(err, stock.ErrRebuilt) {
		t.Fatalf("a decrease counting a withdrawal the rebuild drops: %v, want ErrRebuilt", err)
	}
	if c, err := f.l.GetCampaign(ctx, f.cfg.CampaignID); err != nil || c.Allocation != 100 {
		t.Fatalf("ledger allocation %d (%v), want 100: nothing recorded", c.Allocation, err)
	}
}

func TestRestockExactlyOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(10), withShards(3))
		ctx := context.Background()
		reserveMany(t, f, "r", 4)
		for range 3 {
			if _, err := f.e.ApplyAllocation(ctx, 510); err != nil {
				t.Fatal(err)
			}
		}
		c := f.assertConserved()
		if c.Allocation != 510 || c.Available != 506 {
			t.Fatalf("counts %+v", c)
		}
		// A change recorded in the ledger but not yet applied to Redis (a crash in
		// between) is finished by the next call, once.
		if _, planned, err := f.l.PlanAllocationIncrease(ctx, f.cfg.CampaignID, 600); err != nil || !planned {
			t.Fatal(planned, err)
		}
		for range 2 {
			if _, err := f.e.ApplyAllocation(ctx, 600); err != nil {
				t.Fatal(err)
			}
		}
		c = f.assertConserved()
		if c.Allocation != 600 || c.Available != 596 {
			t.Fatalf("counts %+v", c)
		}
		// A rebuild after the change keeps it exactly once too.
		if _, err := f.e.Rebuild(ctx, openGate); err != nil {
			t.Fatal(err)
		}
		if _, err := f.e.ApplyAllocation(ctx, 600); err != nil {
			t.Fatal(err)
		}
		if c := f.assertConserved(); c.Available != 596 {
			t.Fatalf("counts after rebuild %+v", c)
		}
		if _, err := f.e.ApplyAllocation(ctx, 3); !errors.Is(err, engine.ErrBelowHeld) {
			t.Fatalf("a decrease below the 4 reserved units must be refused: %v", err)
		}
		if c := f.assertConserved(); c.Allocation != 600 || c.Available != 596 {
			t.Fatalf("a refused decrease changed something: %+v", c)
		}
	})
}

// Lowering the allocation above what is sold and reserved removes units from the
// available stock, exactly once; below it is refused and changes nothing; while
// units are reserved it waits for them, holding what it withdrew out of stock.
func TestAllocationDecrease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(100), withShards(4), withTTL(shortTTL, 0))
		ctx := context.Background()
		ids := reserveMany(t, f, "x", 10)
		if _, err := f.e.Checkout(ctx, "x-0", ids[0], "pay"); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := f.e.ApplyAllocation(ctx, 60); err != nil {
				t.Fatal(err)
			}
		}
		c := f.assertConserved()
		if c.Allocation != 60 || c.Available != 50 || c.Withdrawn != 0 {
			t.Fatalf("after lowering to 60: %+v", c)
		}
		// Only 50 units are available: lowering to 15 needs 45, fine; to 5 is below
		// the 10 held units.
		if _, err := f.e.ApplyAllocation(ctx, 5); !errors.Is(err, engine.ErrBelowHeld) {
			t.Fatalf("below held: %v", err)
		}
		if c := f.assertConserved(); c.Allocation != 60 || c.Available != 50 {
			t.Fatalf("a refused decrease changed something: %+v", c)
		}
		// Lowering to 10 takes every available unit.
		_, err := f.e.ApplyAllocation(ctx, 10)
		if err != nil {
			t.Fatalf("lower to 10: %v", err)
		}
		if c := f.assertConserved(); c.Allocation != 10 || c.Available != 0 {
			t.Fatalf("after lowering to 10: %+v", c)
		}
		// A rebuild keeps the lowered allocation.
		if _, err := f.e.Rebuild(ctx, openGate); err != nil {
			t.Fatal(err)
		}
		if c := f.assertConserved(); c.Allocation != 10 || c.Available != 0 || c.Sold != 1 {
			t.Fatalf("after rebuild: %+v", c)
		}
		// Now the 9 pending expire: the stock comes back within the new allocation.
		time.Sleep(shortTTL + 100*time.Millisecond)
		f.sweepUntilQuiet()
		if c := f.assertConserved(); c.Allocation != 10 || c.Available != 9 {
			t.Fatalf("after expiry: %+v", c)
		}
	})
}

// A decrease that needs units held in Redis by reservations the ledger does not
// know (the API died before writing them) waits for the sweeper to release them,
// and keeps what it withdrew out of stock meanwhile.
func TestAllocationDecreasePending(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(20), withShards(2), withTTL(shortTTL, 0))
	ctx := context.Background()
	for i := range 10 {
		user := fmt.Sprintf("z-%d", i)
		home := stock.HomeShard(user, 2)
		r, err := f.e.Store().Reserve(ctx, stock.ReserveRequest{
			Shard: home, Home: home, Mode: stock.ModeHome, User: user, Quantity: 1, MaxPerUser: 1, TTL: shortTTL,
			Key: stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, "r"),
		})
		if err != nil || r.Code != stock.Reserved {
			t.Fatalf("%+v %v", r, err)
		}
	}
	_, err := f.e.ApplyAllocation(ctx, 5)
	if !errors.Is(err, engine.ErrAllocationPending) {
		t.Fatalf("want pending, got %v", err)
	}
	c := f.counts()
	if c.Allocation != 20 || c.Available != 0 || c.Withdrawn != 10 || !c.Conserved() {
		t.Fatalf("while pending: %+v", c)
	}
	if r := f.reserve("late-buyer", "r", 1); r.Outcome != engine.OutcomeSoldOut {
		t.Fatalf("withdrawn units must not be reservable: %s", r.Outcome)
	}
	time.Sleep(shortTTL + 100*time.Millisecond)
	if st := f.sweepUntilQuiet(); st.Abandoned != 10 {
		t.Fatalf("sweep %+v", st)
	}
	if _, err := f.e.ApplyAllocation(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if c := f.assertConserved(); c.Allocation != 5 || c.Available != 5 || c.Withdrawn != 0 {
		t.Fatalf("%+v", c)
	}
	// Raising again after a decrease adds exactly the difference.
	if _, err := f.e.ApplyAllocation(ctx, 8); err != nil {
		t.Fatal(err)
	}
	if c := f.assertConserved(); c.Allocation != 8 || c.Available != 8 {
		t.Fatalf("%+v", c)
	}
}

// TestAllocationDecreaseCrashedAfterRecording: the decrease's units were
// withdrawn and the decrease recorded in the ledger, then the process died (or
// Redis failed) before any shard settled it. Whatever the next call asks for,
// the same allocation again, a restock or a further decrease, the recorded
// decrease is settled first: the withdrawn units never go back into stock.
func TestAllocationDecreaseCrashedAfterRecording(t *testing.T) {
	for _, target := range []int64{80, 90, 70} {
		t.Run(strconv.FormatInt(target, 10), func(t *testing.T) {
			f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(100), withShards(4))
			ctx := context.Background()
			reserveMany(t, f, "held", 10)
			// What withdrawForDecrease does for 100 -> 80, up to the crash.
			camp, err := f.l.GetCampaign(ctx, f.cfg.CampaignID)
			if err != nil {
				t.Fatal(err)
			}
			for shard := range 4 {
				if moved, _, err := f.e.Store().Withdraw(ctx, shard, camp.Epoch, 5); err != nil || moved != 5 {
					t.Fatalf("withdraw from shard %d: %d %v", shard, moved, err)
				}
			}
			if _, err := f.l.RecordAllocationDecrease(ctx, f.cfg.CampaignID, camp.Epoch, 100, 80, []int64{-5, -5, -5, -5}); err != nil {
				t.Fatal(err)
			}

			if _, err := f.e.ApplyAllocation(ctx, target); err != nil {
				t.Fatal(err)
			}
			c := f.assertConserved()
			if c.Allocation != target || c.Withdrawn != 0 || c.Available != target-10 {
				t.Fatalf("after ApplyAllocation(%d): %+v", target, c)
			}
			for _, s := range c.Shards {
				if s.Withdrawn != 0 {
					t.Fatalf("shard %d has %d withdrawn units left", s.Index, s.Withdrawn)
				}
			}
			// Selling out takes exactly what the allocation leaves: 400 buyers
			// reach every shard many times over.
			sold := 0
			for i := range 400 {
				if r := f.reserve(fmt.Sprintf("buyer-%d", i), "r", 1); r.Outcome == engine.OutcomeReserved {
					sold++
				}
			}
			if int64(sold) != target-10 {
				t.Fatalf("%d more units reserved, the allocation %d leaves %d", sold, target, target-10)
			}
		})
	}
}

// TestConservedSeesEachShard: the sums can balance while one shard's counters
// are broken; Conserved must not be fooled by that.
func TestConservedSeesEachShard(t *testing.T) {
	ok := engine.Counts{Allocation: 80, Available: 68, Reserved: 10, Sold: 2, Shards: []engine.ShardCounts{
		{Index: 0, Available: 34, Reserved: 5, Sold: 1, Allocation: 40}, {Index: 1, Available: 34, Reserved: 5, Sold: 1, Allocation: 40},
	}}
	if !ok.Conserved() {
		t.Fatalf("%+v must be conserved", ok)
	}
	for name, c := range map[string]engine.Counts{
		// 20 units back in stock against a settled decrease (withdrawn -20).
		"withdrawn below zero": {Allocation: 80, Available: 90, Reserved: 10, Withdrawn: -20, Shards: []engine.ShardCounts{
			{Index: 0, Available: 45, Reserved: 5, Withdrawn: -10, Allocation: 40}, {Index: 1, Available: 45, Reserved: 5, Withdrawn: -10, Allocation: 40},
		}},
		"stock below zero": {Allocation: 80, Available: 70, Reserved: 10, Shards: []engine.ShardCounts{
			{Index: 0, Available: 75, Reserved: 5, Allocation: 40}, {Index: 1, Available: -5, Reserved: 5, Allocation: 40},
		}},
		// The last reservation of a shard released twice: stock up by two,
		// the reserved counter below zero; the sums still balance.
		"released twice": {Allocation: 80, Available: 7, Reserved: 3, Sold: 70, Shards: []engine.ShardCounts{
			{Index: 0, Available: 2, Reserved: -1, Sold: 39, Allocation: 40}, {Index: 1, Available: 5, Reserved: 4, Sold: 31, Allocation: 40},
		}},
		// One shard over its allocation, the other under by as much.
		"shards off in opposite ways": {Allocation: 80, Available: 70, Reserved: 10, Shards: []engine.ShardCounts{
			{Index: 0, Available: 45, Reserved: 5, Allocation: 40}, {Index: 1, Available: 25, Reserved: 5, Allocation: 40},
		}},
	} {
		if c.Conserved() {
			t.Errorf("%s: %+v must not be conserved", name, c)
		}
	}
}
