package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A home shard that fails the quota give-backs of the stolen reservations a
// pass releases (its server stalls; on a Redis Cluster, another master) holds
// back those give-backs only: the shard the units were stolen from is swept
// to its end in the same pass (more than one batch), its own claims are
// reaped, and once a pipeline of give-backs to the home shard failed the
// later ones are not sent. The quota goes back by the home shard's claim
// reaper once it answers.
func TestFailedQuotaGiveBacksDoNotHoldBackTheirShard(t *testing.T) {
	ctx := context.Background()
	rdb, lost := withLostReplies(t, backends()[0])
	const n = 2*engine.SweepBatch + 88
	f := newFixture(t, rdb, withShards(2), withAllocation(2*n), withSteal(1),
		withTTL(shortTTL, 100*time.Millisecond), withClaimSlack(100*time.Millisecond))
	_, buyers := f.stealFromShard0(n)
	// A claim on shard 0, sold out now, that its placing process never
	// confirmed: shard 0's own claim reaper gives it back.
	s := f.e.Store()
	claimer := userHomedOn("claimer", 0, 2)
	key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, claimer, "r")
	if r, err := s.Reserve(ctx, stock.ReserveRequest{Shard: 0, Home: 0, Mode: stock.ModeClaim, User: claimer, Key: key,
		Quantity: 1, MaxPerUser: 1, TTL: time.Minute}); err != nil || r.Code != stock.Claimed {
		t.Fatalf("claim: %+v %v", r, err)
	}
	time.Sleep(shortTTL + 400*time.Millisecond)

	lost.armDrop(1<<30, isQuotaOp(stock.QuotaRelease))
	st, _ := f.e.Sweep(ctx) // shard 1's reaper fails on the same give-backs
	if left, err := s.Expired(ctx, 0, time.Now().Add(time.Hour).UnixMilli(), 0, 1); err != nil || len(left) != 0 {
		t.Fatalf("pass %+v left shard 0's index with %v (%v), want it swept to its end", st, left, err)
	}
	if st.QuotaDeferred != n || st.DeferredBecause == nil {
		t.Fatalf("pass %+v: want the %d give-backs that failed counted, and why", st, n)
	}
	// Those of the first pipeline were sent; the later ones, in its batch
	// and in the pass, would each have waited for a server that does not
	// answer. (Shard 1's claim reaper sends one of its own, and stops at its
	// failure.)
	if sent := lost.count(); sent > stock.ReleaseBatch+1 {
		t.Fatalf("%d give-backs sent to the failing home shard, want the first pipeline's %d (and the reaper's)", sent, stock.ReleaseBatch)
	}
	if _, err := rdb.HGet(ctx, s.Keys(0).Users(), stock.PointerFieldPrefix+key).Result(); err != redis.Nil {
		t.Fatalf("pass %+v left the dead claim on shard 0 (%v)", st, err)
	}

	lost.arm(0, nil)
	f.sweepUntilQuiet()
	f.assertQuotaCovers()
	f.assertConserved()
	for _, u := range buyers {
		if r := f.reserve(u, "again", 1); r.Outcome != engine.OutcomeReserved {
			t.Fatalf("%s after the home shard answered: %s, want its quota back", u, r.Outcome)
		}
	}
}
