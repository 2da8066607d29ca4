package engine_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A pass sweeps at most its budget of batches on a shard, then goes on to the
// next shards: a backlog on the first shards (taken in index order, four at
// a time) no longer keeps the others' expired units waiting until it drains,
// nor past a pass cut at its time limit. Here shards 0-3 hold five batches of
// expired reservations each and shard 4 one reservation, the budget is one
// batch, and the pass is cut after its fifth batch: shard 4 was swept. Before
// the budget, shard 4 started only once one of the first four had drained,
// after the cut.
func TestSweepPassVisitsEveryShard(t *testing.T) {
	const shards, perShard = 5, 5 * engine.SweepBatch
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(shards*perShard), withShards(shards),
		withSteal(0), withTTL(shortTTL, 0))
	var users []string
	counts := make([]int, shards)
	for i := 0; len(users) < 4*perShard+1; i++ {
		u := fmt.Sprintf("b-%d", i)
		if h := stock.HomeShard(u, shards); h < 4 && counts[h] < perShard || h == 4 && counts[h] == 0 {
			counts[h]++
			users = append(users, u)
		}
	}
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(users)); i = next.Add(1) - 1 {
				if r, err := f.e.Reserve(context.Background(), users[i], "r", 1); err != nil || r.Outcome != engine.OutcomeReserved {
					t.Errorf("reserve %s: %+v %v", users[i], r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	time.Sleep(shortTTL + 200*time.Millisecond) // every reservation expired
	f.e.SetSweepBudget(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var batches atomic.Int64
	f.e.SetSweptBatch(func() {
		if batches.Add(1) == 5 {
			cancel() // the pass's time limit, after its fifth batch
		}
	})
	st, _ := f.e.Sweep(ctx)
	if held := f.counts().Shards[4].Reserved; held != 0 {
		t.Fatalf("shard 4 still holds %d expired units after a pass cut at its fifth batch (%+v)", held, st)
	}
	f.e.SetSweptBatch(nil)
	for range 10 {
		st, err := f.e.Sweep(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog == 0 {
			break
		}
	}
	if c := f.assertConserved(); c.Reserved != 0 {
		t.Fatalf("after the passes: %+v", c)
	}
}

// Stale claims, like expired reservations, are reaped a budget of batches a
// pass, and a pass that leaves some says so: a shard with thousands (its
// home master's give-backs deferred through a stall) no longer holds one of
// the pass's sweep slots until it drains, while other shards' expired units
// wait. Here the budget is one batch and the claims one more than a batch.
func TestStaleClaimsAreReapedABudgetAPass(t *testing.T) {
	const slack = 100 * time.Millisecond
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(2), withShards(2), withSteal(1),
		withTTL(shortTTL, 0), withClaimSlack(slack))
	ctx := context.Background()
	f.sellOutShard(0)
	// Buyers homed on the sold-out shard 0 claim their quota to steal, and
	// their process dies before it places them anywhere.
	claims := engine.SweepBatch + 1
	for i := range claims {
		user := userHomedOn(fmt.Sprintf("claimer%d", i), 0, 2)
		key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, "r")
		r, err := f.e.Store().Reserve(ctx, stock.ReserveRequest{Shard: 0, Home: 0, Mode: stock.ModeClaim, User: user, Key: key,
			Quantity: 1, MaxPerUser: 1, TTL: f.cfg.TTL})
		if err != nil || r.Code != stock.Claimed {
			t.Fatalf("claim %d: %+v %v", i, r, err)
		}
	}
	time.Sleep(shortTTL + slack + 200*time.Millisecond)
	f.e.SetSweepBudget(1)
	st, err := f.e.Sweep(ctx)
	if err != nil || st.ReapedClaims != engine.SweepBatch || st.Backlog != 1 {
		t.Fatalf("first pass: %+v %v, want one batch of claims reaped and a backlog", st, err)
	}
	st, err = f.e.Sweep(ctx)
	if err != nil || st.ReapedClaims != 1 || st.Backlog != 0 {
		t.Fatalf("second pass: %+v %v, want the last claim reaped and no backlog", st, err)
	}
}

// Claims the reaper must leave for now (their stolen reservation not swept
// yet) are stepped over, not listed again: a first batch of them no longer
// ends the shard's reaping for the pass, leaving a dead process's claim
// behind them, its buyer at the limit, until they settle.
func TestClaimsLeftForNowDoNotHideTheOnesBehind(t *testing.T) {
	const slack = 100 * time.Millisecond
	left := engine.SweepBatch + 1
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(int64(2*left)), withShards(2), withSteal(1),
		withTTL(shortTTL, 0), withClaimSlack(slack))
	ctx := context.Background()
	s := f.e.Store()
	f.sellOutShard(0)
	// The oldest claims were placed on shard 1, for an hour: their
	// reservations are held, and the reaper leaves their quota alone.
	for i := range left {
		placedClaim(t, f, userHomedOn(fmt.Sprintf("placed%d", i), 0, 2), 1)
	}
	// Behind them, a claim whose process died before it placed anything.
	time.Sleep(2 * time.Millisecond)
	dead := userHomedOn("dead", 0, 2)
	deadClaim(t, f, dead)
	time.Sleep(shortTTL + slack + 200*time.Millisecond)
	st, err := f.e.Sweep(ctx)
	if err != nil || st.ReapedClaims != 1 {
		t.Fatalf("pass: %+v %v, want the dead process's claim reaped", st, err)
	}
	if held, err := f.rdb.HGet(ctx, s.Keys(0).Users(), dead).Result(); err == nil {
		t.Fatalf("the dead process's buyer still holds %s on its home shard", held)
	}
}

// A pass whose budget ends among claims left for now does not ask for
// another pass at once: it would read them all again and go no further.
// Here a dead process's claim comes first, then two batches of claims left
// for now (placed on shards 1 and 2), and the budget is two batches.
func TestAPassEndingAmongClaimsLeftForNowLeavesNoBacklog(t *testing.T) {
	const slack = 100 * time.Millisecond
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(3*engine.SweepBatch), withShards(3), withSteal(1),
		withTTL(shortTTL, 0), withClaimSlack(slack))
	f.sellOutShard(0) // one batch of expired reservations there: no backlog of its own
	deadClaim(t, f, userHomedOn("dead", 0, 3))
	time.Sleep(2 * time.Millisecond)
	for i := range 2 * engine.SweepBatch {
		placedClaim(t, f, userHomedOn(fmt.Sprintf("placed%d", i), 0, 3), 1+i%2)
	}
	time.Sleep(shortTTL + slack + 200*time.Millisecond)
	f.e.SetSweepBudget(2)
	st, err := f.e.Sweep(context.Background())
	if err != nil || st.ReapedClaims != 1 || st.Backlog != 0 {
		t.Fatalf("pass: %+v %v, want the dead process's claim reaped and no backlog", st, err)
	}
}

// deadClaim claims user's quota on the sold-out shard 0 to steal, as a
// process that then died: nothing placed.
func deadClaim(t *testing.T, f *fixture, user string) (key, stamp string) {
	t.Helper()
	key = stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, "r")
	r, err := f.e.Store().Reserve(context.Background(), stock.ReserveRequest{Shard: 0, Home: 0, Mode: stock.ModeClaim, User: user, Key: key,
		Quantity: 1, MaxPerUser: 1, TTL: f.cfg.TTL})
	if err != nil || r.Code != stock.Claimed {
		t.Fatalf("claim of %s: %+v %v", user, r, err)
	}
	return key, r.Status
}

// placedClaim is deadClaim's claim placed on the shard named by on, for an hour, and
// confirmed: the reaper leaves its quota alone while it is held.
func placedClaim(t *testing.T, f *fixture, user string, on int) {
	t.Helper()
	ctx := context.Background()
	s := f.e.Store()
	key, stamp := deadClaim(t, f, user)
	p, err := s.Reserve(ctx, stock.ReserveRequest{Shard: on, Home: 0, Mode: stock.ModeSteal, User: user, Key: key,
		Quantity: 1, MaxPerUser: 1, TTL: time.Hour})
	if err != nil || p.Code != stock.Reserved {
		t.Fatalf("steal of %s: %+v %v", user, p, err)
	}
	if ok, err := s.ConfirmClaim(ctx, 0, key, stamp, on, p.ExpiryMs); err != nil || !ok {
		t.Fatalf("confirm of %s: %v %v", user, ok, err)
	}
}

// Paying marks too are settled a budget of batches a pass, the rest left
// to the next pass, which starts at once. Here the budget is one batch, and
// one more mark than a batch was left by checkouts that never reached the
// ledger.
func TestPayingMarksAreSettledABudgetAPass(t *testing.T) {
	marks := engine.SweepBatch + 1
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(int64(marks)), withShards(1))
	ctx := context.Background()
	s := f.e.Store()
	for i := range marks {
		user := fmt.Sprintf("payer%d", i)
		key, _ := f.placeUnrecorded(user, time.Hour)
		if at, err := s.MarkPaying(ctx, 0, key, user); err != nil || at == 0 {
			t.Fatalf("paying mark of %s: %d %v", user, at, err)
		}
	}
	paying := func() int64 {
		n, err := f.rdb.ZCard(ctx, s.Keys(0).Paying()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	f.e.SetSweepBudget(1)
	if st, err := f.e.Sweep(ctx); err != nil || st.Backlog != 1 || paying() != 1 {
		t.Fatalf("first pass: %+v %v, %d marks left; want one batch settled and a backlog", st, err, paying())
	}
	if st, err := f.e.Sweep(ctx); err != nil || st.Backlog != 0 || paying() != 0 {
		t.Fatalf("second pass: %+v %v, %d marks left; want none and no backlog", st, err, paying())
	}
}

// Reservations the ledger says are not expired yet (the database's clock
// behind Redis's) stay in the index and are skipped; the pass's next batch
// steps over them instead of reading and counting them again. Here the
// first 100 of 300 expired reservations are skipped once each.
func TestSkippedReservationsAreCountedOncePerPass(t *testing.T) {
	const n, behind = 300, 100
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(n), withShards(1), withTTL(shortTTL, 0))
	ctx := context.Background()
	for i := range n {
		if r := f.reserve(fmt.Sprintf("late%d", i), "r", 1); r.Outcome != engine.OutcomeReserved {
			t.Fatalf("reserve %d: %s", i, r.Outcome)
		}
	}
	time.Sleep(shortTTL + 200*time.Millisecond)
	first, err := f.e.Store().Expired(ctx, 0, time.Now().Add(time.Hour).UnixMilli(), 0, behind)
	if err != nil || len(first) != behind {
		t.Fatalf("the first %d expired: %d %v", behind, len(first), err)
	}
	ids := make([]string, behind)
	for i, l := range first {
		ids[i] = stock.FormatID(0, l.Key)
	}
	if tag, err := f.l.Pool().Exec(ctx, `UPDATE flashsale_orders SET expires_at = expires_at + interval '1 hour'
WHERE campaign_id = $1 AND reservation_id = ANY($2)`, f.cfg.CampaignID, ids); err != nil || tag.RowsAffected() != behind {
		t.Fatalf("moving %d rows' expiry: %v %v", behind, tag, err)
	}
	st, err := f.e.Sweep(ctx)
	if err != nil || st.Skipped != behind || st.Released != n-behind {
		t.Fatalf("pass: %+v %v, want %d skipped and %d released", st, err, behind, n-behind)
	}
}
