package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// liveUnits is what the ledger says user holds: PENDING and COMMITTED units.
func liveUnits(t *testing.T, f *fixture, user string) (units int64) {
	t.Helper()
	err := f.l.Pool().QueryRow(context.Background(),
		`SELECT coalesce(sum(quantity),0) FROM flashsale_orders
		 WHERE campaign_id=$1 AND user_id=$2 AND status IN ('PENDING','COMMITTED')`,
		f.cfg.CampaignID, user).Scan(&units)
	if err != nil {
		t.Fatal(err)
	}
	return units
}

// requestRows counts the ledger rows of user's request "r", on any shard: I4
// allows one.
func requestRows(t *testing.T, f *fixture, user string) int64 {
	t.Helper()
	key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, "r")
	var n int64
	err := f.l.Pool().QueryRow(context.Background(),
		`SELECT count(*) FROM flashsale_orders WHERE campaign_id=$1 AND split_part(reservation_id, '.', 2) = $2`,
		f.cfg.CampaignID, key).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Break: the reply of the steal probe that took a unit is lost. The unit is
// this request's: the engine looks at the target shard and finishes the
// reservation there, instead of giving the claimed quota back and leaving the
// unit on that shard with no pointer and no row (then a retry of the same
// request took a second unit on another shard, and the orphan's release took
// the quota of the second).
func TestLostStealReplyIsResolvedOnTheTarget(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			rdb, lost := withLostReplies(t, b)
			f := newFixture(t, rdb, withAllocation(3), withShards(3), withMaxPerUser(1))
			ctx := context.Background()
			f.sellOutShard(0)
			buyer := userHomedOn("buyer", 0, 3)

			lost.arm(1, isReserveMode(stock.ModeSteal))
			r, err := f.e.Reserve(ctx, buyer, "r", 1)
			if lost.count() != 1 {
				t.Fatalf("%d steal replies lost, want 1", lost.count())
			}
			f.assertQuotaCovers()
			if err != nil || r.Outcome != engine.OutcomeReserved || r.Reservation.Shard == 0 {
				t.Fatalf("reserve with the steal reply lost: %+v %v, want the unit the probe took, RESERVED", r, err)
			}
			again := f.reserve(buyer, "r", 1)
			if again.Outcome != engine.OutcomeReplayed || again.Reservation.ID != r.Reservation.ID {
				t.Fatalf("retry: %+v, want REPLAYED %s", again, r.Reservation.ID)
			}
			if other := f.reserve(buyer, "other", 1); other.Outcome != engine.OutcomeLimit {
				t.Fatalf("another request: %s, want LIMIT_EXCEEDED", other.Outcome)
			}
			if units := liveUnits(t, f, buyer); units != 1 {
				t.Fatalf("the ledger says %s holds %d units, want 1", buyer, units)
			}
			f.assertQuotaCovers()
			f.assertConserved()
		})
	}
}

// Break: a quota give-back acted on whatever pointer the request's key had on
// the home shard. An orphan of the request on shard 1 (placed by a process
// that died before confirming) is released by the sweeper while the same
// request's live reservation sits on shard 2: the give-back must leave the
// live one's pointer and quota alone.
func TestQuotaGiveBackActsOnItsOwnReservation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(6), withShards(3), withMaxPerUser(1), withTTL(shortTTL, 0))
		ctx := context.Background()
		s := f.e.Store()
		f.sellOutShard(0)
		buyer := userHomedOn("buyer", 0, 3)
		key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, buyer, "r")
		req := stock.ReserveRequest{Shard: 0, Home: 0, Mode: stock.ModeClaim, User: buyer, Key: key,
			Quantity: 1, MaxPerUser: 1, TTL: shortTTL}
		// The orphan: claimed and placed on shard 1, never confirmed; the
		// process died, the claim was reaped.
		if c, err := s.Reserve(ctx, req); err != nil || c.Code != stock.Claimed {
			t.Fatalf("claim: %+v %v", c, err)
		}
		steal := req
		steal.Shard, steal.Mode = 1, stock.ModeSteal
		orphan, err := s.Reserve(ctx, steal)
		if err != nil || orphan.Code != stock.Reserved {
			t.Fatalf("orphan: %+v %v", orphan, err)
		}
		now, err := s.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok, _, err := s.ReapClaim(ctx, 0, key, now.Add(time.Hour)); err != nil || !ok {
			t.Fatalf("reap: %v %v", ok, err)
		}
		// The same request placed on shard 2 for an hour, and confirmed.
		c, err := s.Reserve(ctx, req)
		if err != nil || c.Code != stock.Claimed {
			t.Fatalf("second claim: %+v %v", c, err)
		}
		steal.Shard, steal.TTL = 2, time.Hour
		live, err := s.Reserve(ctx, steal)
		if err != nil || live.Code != stock.Reserved {
			t.Fatalf("live: %+v %v", live, err)
		}
		if ok, err := s.ConfirmClaim(ctx, 0, key, c.Status, 2, live.ExpiryMs); err != nil || !ok {
			t.Fatalf("confirm: %v %v", ok, err)
		}

		waitRedisPast(t, f, orphan.ExpiryMs)
		if st := f.sweepUntilQuiet(); st.Abandoned != 1 {
			t.Fatalf("sweep %+v, want the orphan abandoned and released", st)
		}
		if ptr, err := rdb.HGet(ctx, s.Keys(0).Users(), "p:"+key).Result(); err != nil || ptr != stock.Pointer(2, live.ExpiryMs) {
			t.Fatalf("the live reservation's pointer after the orphan's release: %q %v", ptr, err)
		}
		if q, err := rdb.HGet(ctx, s.Keys(0).Users(), buyer).Result(); err != nil || q != "1" {
			t.Fatalf("the buyer's quota after the orphan's release: %q %v, want 1", q, err)
		}
	})
}

// waitRedisPast waits until the Redis clock is past ms.
func waitRedisPast(t *testing.T, f *fixture, ms int64) {
	t.Helper()
	for {
		now, err := f.e.Store().Now(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if now.UnixMilli() > ms {
			return
		}
		time.Sleep(time.Duration(ms-now.UnixMilli()+1) * time.Millisecond)
	}
}

// Break: idempotency was per shard. A cancelled request retried while its
// home shard is sold out was placed anew on another shard.
func TestRetryOfACancelledRequestOnAnotherShard(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(3), withShards(3), withMaxPerUser(1))
		ctx := context.Background()
		buyer := userHomedOn("buyer", 0, 3)
		r := f.reserve(buyer, "r", 1)
		if r.Outcome != engine.OutcomeReserved || r.Reservation.Shard != 0 {
			t.Fatalf("reserve: %+v", r)
		}
		if c, err := f.e.Cancel(ctx, buyer, r.Reservation.ID); err != nil || c.Outcome != ledger.CancelCancelled {
			t.Fatalf("cancel: %v %v", c.Outcome, err)
		}
		f.sellOutShard(0)
		if again := f.reserve(buyer, "r", 1); again.Outcome != engine.OutcomeExpired {
			t.Fatalf("retry of the cancelled request: %+v, want EXPIRED", again)
		}
		if n := requestRows(t, f, buyer); n != 1 {
			t.Fatalf("%d ledger rows for one request", n)
		}
		if units := liveUnits(t, f, buyer); units != 0 {
			t.Fatalf("the buyer holds %d units after cancelling", units)
		}
		f.assertQuotaCovers()
		f.assertConserved()
	})
}

// Break: a cancelled stolen reservation, retried, was placed again on a third
// shard.
func TestRetryOfACancelledStolenRequest(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(3), withShards(3), withMaxPerUser(1))
		ctx := context.Background()
		f.sellOutShard(0)
		buyer := userHomedOn("buyer", 0, 3)
		r := f.reserve(buyer, "r", 1)
		if r.Outcome != engine.OutcomeReserved || r.Reservation.Shard == 0 {
			t.Fatalf("reserve: %+v, want a stolen reservation", r)
		}
		if c, err := f.e.Cancel(ctx, buyer, r.Reservation.ID); err != nil || c.Outcome != ledger.CancelCancelled {
			t.Fatalf("cancel: %v %v", c.Outcome, err)
		}
		// The unit given back is sold again to a buyer of that shard: only
		// the third shard has stock now.
		f.reserve(userHomedOn("local", r.Reservation.Shard, 3), "r", 1)
		if again := f.reserve(buyer, "r", 1); again.Outcome != engine.OutcomeExpired {
			t.Fatalf("retry of the cancelled stolen request: %+v, want EXPIRED", again)
		}
		if n := requestRows(t, f, buyer); n != 1 {
			t.Fatalf("%d ledger rows for one request", n)
		}
		f.assertQuotaCovers()
		f.assertConserved()
	})
}

// Break: a paid request whose Redis hash is gone (the backstop TTL) was
// answered LIMIT_EXCEEDED, or placed anew when the home shard was sold out,
// instead of replayed from the ledger.
func TestRetryOfAPaidRequestWhoseHashIsGone(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, max := range []int{1, 2} {
			t.Run(fmt.Sprintf("maxPerUser=%d", max), func(t *testing.T) { testRetryOfAPaidRequest(t, rdb, max) })
		}
	})
}

func testRetryOfAPaidRequest(t *testing.T, rdb redis.UniversalClient, max int) {
	f := newFixture(t, rdb, withAllocation(3), withShards(3), withMaxPerUser(max))
	ctx := context.Background()
	buyer := userHomedOn("buyer", 0, 3)
	r := f.reserve(buyer, "r", 1)
	if r.Outcome != engine.OutcomeReserved || r.Reservation.Shard != 0 {
		t.Fatalf("reserve: %+v", r)
	}
	if co, err := f.e.Checkout(ctx, buyer, r.Reservation.ID, "pay"); err != nil || co.Outcome != ledger.CheckoutCommitted {
		t.Fatalf("checkout: %v %v", co.Outcome, err)
	}
	key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, buyer, "r")
	if err := rdb.Del(ctx, f.e.Store().Keys(0).Res(key)).Err(); err != nil {
		t.Fatal(err)
	}
	again := f.reserve(buyer, "r", 1)
	if again.Outcome != engine.OutcomeReplayed || again.Reservation.ID != r.Reservation.ID {
		t.Fatalf("maxPerUser %d: retry of the paid request: %+v, want REPLAYED %s", max, again, r.Reservation.ID)
	}
	if n := requestRows(t, f, buyer); n != 1 {
		t.Fatalf("maxPerUser %d: %d ledger rows for one request", max, n)
	}
	if units := liveUnits(t, f, buyer); units != 1 {
		t.Fatalf("maxPerUser %d: the buyer holds %d units, want the 1 paid", max, units)
	}
	c := f.counts()
	if c.Sold != 1 || c.Reserved != 0 || c.Available != 2 {
		t.Fatalf("maxPerUser %d: counts %+v, want 1 sold, 2 available", max, c)
	}
}

// isQuotaOp matches a quota.lua call of op (its ARGV[1]).
func isQuotaOp(op string) func(args []any) bool {
	return func(args []any) bool {
		if len(args) < 6 {
			return false
		}
		name, _ := args[0].(string)
		got, _ := args[5].(string)
		return strings.HasPrefix(strings.ToLower(name), "eval") && got == op
	}
}

// The confirm of a stolen reservation gets no answer, whether it ran (its
// reply lost) or not (the command lost): the unit and the quota both go
// back, once, and the request can be retried at once (no claim is left to
// answer BUSY).
func TestLostConfirmGivesBackOnce(t *testing.T) {
	for _, b := range backends() {
		for _, ran := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/ran=%v", b.name, ran), func(t *testing.T) { testLostConfirm(t, b, ran) })
		}
	}
}

func testLostConfirm(t *testing.T, b backend, ran bool) {
	rdb, lost := withLostReplies(t, b)
	f := newFixture(t, rdb, withAllocation(3), withShards(3), withMaxPerUser(1))
	ctx := context.Background()
	f.sellOutShard(0)
	before := f.perBuyerState()
	buyer := userHomedOn("buyer", 0, 3)
	if ran {
		lost.arm(1, isQuotaOp("confirm"))
	} else {
		lost.armDrop(1, isQuotaOp("confirm"))
	}
	if r, err := f.e.Reserve(ctx, buyer, "r", 1); !errors.Is(err, engine.ErrUnavailable) || lost.count() != 1 {
		t.Fatalf("reserve with the confirm reply lost: %+v %v (%d lost)", r, err, lost.count())
	}
	if after := f.perBuyerState(); after != before {
		t.Fatalf("after the lost confirm:\n%s\nwant\n%s", after, before)
	}
	if c := f.assertConserved(); c.Available != 2 {
		t.Fatalf("counts %+v: the stolen unit did not come back", c)
	}
	if r := f.reserve(buyer, "r", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatalf("retry: %+v", r)
	}
	f.assertQuotaCovers()
}

// Break: a steal probe whose reply is lost finds the request's reservation on
// its target, but an earlier attempt placed it there, and it is sold (its
// checkout committed the ledger row; the Redis mark did not land and the
// home shard's pointer was forgotten, checkout's own steps). The probe had
// answered REPLAY: the engine must answer the retry from that reservation,
// not take it for one this attempt placed and, its ledger row being a
// duplicate, give the sold unit back to the stock (I1).
func TestLostStealReplyOfAnEarlierAttemptIsAReplay(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			rdb, lost := withLostReplies(t, b)
			f := newFixture(t, rdb, withAllocation(6), withShards(3), withMaxPerUser(2))
			ctx := context.Background()
			s := f.e.Store()
			f.sellOutShard(0)
			buyer := userHomedOn("buyer", 0, 3)
			first := f.reserve(buyer, "r", 1)
			target := first.Reservation.Shard
			if first.Outcome != engine.OutcomeReserved || target == 0 {
				t.Fatalf("first reserve: %+v, want a unit stolen from shard 1 or 2", first)
			}
			f.sellOutShard(3 - target)
			key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, buyer, "r")
			if out, _, err := f.l.Checkout(ctx, f.cfg.CampaignID, first.Reservation.ID, buyer, "pay"); err != nil || out != ledger.CheckoutCommitted {
				t.Fatalf("ledger checkout: %v %v", out, err)
			}
			if _, err := s.Quota(ctx, 0, stock.QuotaForget, buyer, key, 1, target, first.Reservation.ExpiresAt.UnixMilli()); err != nil {
				t.Fatal(err)
			}
			availableBefore := f.counts().Shards[target].Available

			lost.arm(1, func(args []any) bool {
				return isReserveMode(stock.ModeSteal)(args) && strings.Contains(fmt.Sprint(args[3]), s.Keys(target).Meta()[:strings.Index(s.Keys(target).Meta(), "}")+1])
			})
			r, err := f.e.Reserve(ctx, buyer, "r", 1)
			if lost.count() != 1 {
				t.Fatalf("%d steal replies lost, want 1", lost.count())
			}
			if err != nil || r.Outcome != engine.OutcomeReplayed || r.Reservation.ID != first.Reservation.ID {
				t.Fatalf("the retry with its steal reply lost: %+v %v, want REPLAYED %s", r, err, first.Reservation.ID)
			}
			if got := f.counts().Shards[target].Available; got != availableBefore {
				t.Fatalf("shard %d holds %d units in stock after the retry, %d before: the sold unit went back", target, got, availableBefore)
			}
			if n := requestRows(t, f, buyer); n != 1 {
				t.Fatalf("%d ledger rows for the request, want 1", n)
			}
		})
	}
}

// Break: a retried request is placed on another shard (its home sold out),
// its ledger row is a duplicate (the request's first reservation, cancelled
// since, holds the row), so the engine gives the unit back; the release runs
// and its reply is lost. The buyer's quota on the home shard must go back
// too: nothing in the expiry index is left for the sweeper to find, and the
// buyer, holding nothing, would be refused LIMIT_EXCEEDED for the rest of
// the sale.
func TestLostReleaseReplyGivesTheQuotaBack(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			rdb, lost := withLostReplies(t, b)
			f := newFixture(t, rdb, withAllocation(6), withShards(3), withMaxPerUser(1))
			ctx := context.Background()
			buyer := userHomedOn("buyer", 0, 3)
			first := f.reserve(buyer, "r", 1)
			if first.Outcome != engine.OutcomeReserved || first.Reservation.Shard != 0 {
				t.Fatalf("first reserve: %+v, want it on the home shard", first)
			}
			if c, err := f.e.Cancel(ctx, buyer, first.Reservation.ID); err != nil || c.Outcome != ledger.CancelCancelled {
				t.Fatalf("cancel: %+v %v", c, err)
			}
			f.sellOutShard(0)
			lost.arm(1, isScript(t, "release"))
			r, err := f.e.Reserve(ctx, buyer, "r", 1)
			if lost.count() != 1 {
				t.Fatalf("%d release replies lost, want 1 (the retry: %+v %v)", lost.count(), r, err)
			}
			if err != nil || r.Outcome != engine.OutcomeExpired {
				t.Fatalf("the retry of a cancelled request: %+v %v, want EXPIRED", r, err)
			}
			if other := f.reserve(buyer, "other", 1); other.Outcome != engine.OutcomeReserved {
				t.Fatalf("another request of the buyer, who holds nothing: %s, want RESERVED", other.Outcome)
			}
			f.assertQuotaCovers()
			f.assertConserved()
		})
	}
}
