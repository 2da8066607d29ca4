package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Break: the reply of the home shard's call is lost after the script claimed
// the buyer's quota there (the home shard is sold out). The claim was left to
// the reaper (TTL + grace + a minute): meanwhile a retry of the same request
// answered BUSY and, with maxPerUser 1, any other request of the buyer
// LIMIT_EXCEEDED, while other shards had stock. The engine looks at the home
// shard, finds its own claim, and goes on stealing with it.
func TestLostClaimReplyIsResolvedOnTheHomeShard(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			rdb, lost := withLostReplies(t, b)
			f := newFixture(t, rdb, withAllocation(3), withShards(3), withMaxPerUser(1))
			ctx := context.Background()
			f.sellOutShard(0)
			buyer := userHomedOn("buyer", 0, 3)

			lost.arm(1, isReserveMode(stock.ModeClaim))
			r, err := f.e.Reserve(ctx, buyer, "r", 1)
			if lost.count() != 1 {
				t.Fatalf("%d claim replies lost, want 1", lost.count())
			}
			if err != nil || r.Outcome != engine.OutcomeReserved || r.Reservation.Shard == 0 {
				t.Fatalf("reserve with the claim reply lost: %+v %v, want RESERVED on another shard", r, err)
			}
			f.assertQuotaCovers()
			if again := f.reserve(buyer, "r", 1); again.Outcome != engine.OutcomeReplayed || again.Reservation.ID != r.Reservation.ID {
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

// The home shard's call never ran when the engine looked (a stalled server
// runs it later): the engine fences it, so that arriving late it claims
// nothing, and the buyer can retry at once. Before, the late claim held the
// buyer BUSY and at the limit until the reaper.
func TestLateClaimAfterALostReplyTakesNothing(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			rdb, lost := withLostReplies(t, b)
			f := newFixture(t, rdb, withAllocation(3), withShards(3), withMaxPerUser(1))
			ctx := context.Background()
			f.sellOutShard(0)
			before := f.perBuyerState()
			buyer := userHomedOn("buyer", 0, 3)

			lost.armHold(1, isReserveMode(stock.ModeClaim))
			if r, err := f.e.Reserve(ctx, buyer, "r", 1); !errors.Is(err, engine.ErrUnavailable) || lost.count() != 1 {
				t.Fatalf("reserve with the claim held back: %+v %v (%d held)", r, err, lost.count())
			}
			for _, cmd := range lost.sendHeld(ctx, rdb) {
				if err := cmd.Err(); err != nil {
					t.Fatalf("the late claim: %v", err)
				}
			}
			if after := f.perBuyerState(); after != before {
				t.Fatalf("after the late claim:\n%s\nwant\n%s", after, before)
			}
			r := f.reserve(buyer, "r", 1)
			if r.Outcome != engine.OutcomeReserved || r.Reservation.Shard == 0 {
				t.Fatalf("retry: %+v, want RESERVED on another shard", r)
			}
			if units := liveUnits(t, f, buyer); units != 1 {
				t.Fatalf("the ledger says %s holds %d units, want 1", buyer, units)
			}
			f.assertQuotaCovers()
			f.assertConserved()
		})
	}
}

// The home shard's call reserved there and its reply was lost. A retry gets
// the replay of that reservation from Redis, never a second unit; as the
// attempt that lost the reply wrote no row, the replay answers BUSY until the
// engine settles the reservation (Config.SettleStuckAfter), and then the
// request is EXPIRED, its unit back, and the buyer's other requests go
// through. Both with stealing possible (a claim-mode call) and without.
func TestLostHomeReservationReplyIsReplayed(t *testing.T) {
	for _, b := range backends() {
		for _, steal := range []int{2, 0} {
			t.Run(fmt.Sprintf("%s/steal=%d", b.name, steal), func(t *testing.T) {
				mode := stock.ModeClaim
				if steal == 0 {
					mode = stock.ModeHome
				}
				rdb, lost := withLostReplies(t, b)
				f := newFixture(t, rdb, withAllocation(3), withShards(3), withMaxPerUser(1), withSteal(steal),
					withSettleStuckAfter(500*time.Millisecond))
				ctx := context.Background()
				buyer := userHomedOn("buyer", 0, 3)

				lost.arm(1, isReserveMode(mode))
				r, err := f.e.Reserve(ctx, buyer, "r", 1)
				if lost.count() != 1 {
					t.Fatalf("%d replies lost, want 1", lost.count())
				}
				if err == nil && r.Outcome != engine.OutcomeBusy {
					t.Fatalf("reserve with the reply lost: %+v, want BUSY or unavailable", r)
				}
				if c := f.counts(); c.Shards[0].Reserved != 1 || c.Reserved != 1 {
					t.Fatalf("counts %+v, want the one unit on shard 0", c)
				}
				for {
					again := f.reserve(buyer, "r", 1)
					if again.Outcome == engine.OutcomeExpired {
						break
					}
					if again.Outcome != engine.OutcomeBusy {
						t.Fatalf("retry: %+v, want BUSY until settled, then EXPIRED", again)
					}
					if c := f.counts(); c.Reserved != 1 {
						t.Fatalf("a retry took another unit: %+v", c)
					}
				}
				if c := f.counts(); c.Reserved != 0 || c.Available != 3 {
					t.Fatalf("after the settle: %+v, want the unit back", c)
				}
				if other := f.reserve(buyer, "other", 1); other.Outcome != engine.OutcomeReserved {
					t.Fatalf("another request after the settle: %+v", other)
				}
				f.assertQuotaCovers()
				f.assertConserved()
			})
		}
	}
}

// Break (the fence gap): a retry's call is held back by a stalled server while
// the request already has its reservation, so resolving the lost reply finds
// that reservation and answers the replay. The reservation is then cancelled.
// The held call, arriving after that, placed a new reservation nobody waited
// for: a unit and the buyer's quota held until the sweeper's turn. Resolving
// now fences the attempt in the reservation's hash, and a release keeps the
// fence, so the late call takes nothing.
func TestLateCallOfAReplayedRetryTakesNothing(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			rdb, lost := withLostReplies(t, b)
			f := newFixture(t, rdb, withAllocation(3), withShards(3), withMaxPerUser(1))
			ctx := context.Background()
			before := f.perBuyerState()
			buyer := userHomedOn("buyer", 0, 3)

			first := f.reserve(buyer, "r", 1)
			if first.Outcome != engine.OutcomeReserved {
				t.Fatalf("reserve: %+v", first)
			}
			lost.armHold(1, isReserveMode(stock.ModeClaim))
			again, err := f.e.Reserve(ctx, buyer, "r", 1)
			if err != nil || lost.count() != 1 || again.Outcome != engine.OutcomeReplayed || again.Reservation.ID != first.Reservation.ID {
				t.Fatalf("retry with its call held back: %+v %v (%d held), want REPLAYED %s", again, err, lost.count(), first.Reservation.ID)
			}
			if c, err := f.e.Cancel(ctx, buyer, first.Reservation.ID); err != nil || c.Outcome != ledger.CancelCancelled {
				t.Fatalf("cancel: %+v %v", c, err)
			}
			for _, cmd := range lost.sendHeld(ctx, rdb) {
				if err := cmd.Err(); err != nil {
					t.Fatalf("the late call: %v", err)
				}
			}
			if c := f.counts(); c.Reserved != 0 || c.Available != 3 {
				t.Fatalf("after the late call: %+v, want every unit available", c)
			}
			if after := f.perBuyerState(); after != before {
				t.Fatalf("after the late call:\n%s\nwant\n%s", after, before)
			}
			if r := f.reserve(buyer, "r", 1); r.Outcome != engine.OutcomeExpired {
				t.Fatalf("the cancelled request again: %+v, want EXPIRED", r)
			}
			if other := f.reserve(buyer, "other", 1); other.Outcome != engine.OutcomeReserved {
				t.Fatalf("another request: %+v, want RESERVED", other)
			}
			f.assertQuotaCovers()
			f.assertConserved()
		})
	}
}
