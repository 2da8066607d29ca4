package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// A payment and a cancel the ledger takes while their reservations' shard
// is being rebuilt (its reservations restored from the ledger's read, the
// shard not open yet) reach Redis once it opens: the paid unit leaves the
// held count, and the cancelled one goes back to stock with its buyer's
// quota, without waiting for their expiry and the sweeper.
func TestAPaymentAndACancelDuringARebuildReachRedisOnceItOpens(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(10), withShards(1), withTTL(time.Hour, 0))
	ctx := context.Background()
	paid := f.reserve("pat", "r", 1).Reservation
	gone := f.reserve("cal", "r", 1).Reservation
	_, err := f.e.RebuildWith(ctx, engine.RebuildOptions{Gate: openGate, BeforeFinish: func(int) {
		if out, err := f.e.Checkout(ctx, "pat", paid.ID, "pay-1"); err != nil || out.Outcome != ledger.CheckoutCommitted {
			t.Errorf("checkout during the rebuild: %+v %v", out.Outcome, err)
		}
		if out, err := f.e.Cancel(ctx, "cal", gone.ID); err != nil || out.Outcome != ledger.CancelCancelled {
			t.Errorf("cancel during the rebuild: %+v %v", out.Outcome, err)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	var held, available int64
	testharness.Eventually(t, 10*time.Second, "the payment and the cancel in Redis", func() bool {
		states, err := f.e.Store().State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held, available = states[0].Reserved, states[0].Available
		return held == 0 && available == 9
	})
	if c := f.assertConserved(); c.Sold != 1 || c.Reserved != 0 || c.Available != 9 {
		t.Fatalf("counts %+v, want 1 sold and 9 available", c)
	}
	if r := f.reserve("cal", "again", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatalf("cal after the cancel: %s, want the quota back", r.Outcome)
	}
}

// A cancel whose Redis step is lost (the ledger took it, the server did not
// run the release) gives the unit and the buyer's quota back once the server
// answers, not after the reservation's expiry and the sweeper: with a limit
// of one, the buyer may reserve again.
func TestACancelWhoseReleaseWasLostGivesTheUnitBack(t *testing.T) {
	rdb, lost := withLostReplies(t, backends()[0])
	f := newFixture(t, rdb, withAllocation(10), withShards(1), withTTL(time.Hour, 0), withMaxPerUser(1))
	ctx := context.Background()
	r := f.reserve("cal", "r", 1).Reservation
	lost.armDrop(1, isScript(t, "cancel"))
	if out, err := f.e.Cancel(ctx, "cal", r.ID); err != nil || out.Outcome != ledger.CancelCancelled {
		t.Fatalf("cancel: %+v %v", out.Outcome, err)
	}
	if lost.count() != 1 {
		t.Fatalf("%d cancel calls lost, want 1", lost.count())
	}
	testharness.Eventually(t, 10*time.Second, "the unit back in stock", func() bool {
		states, err := f.e.Store().State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return states[0].Reserved == 0 && states[0].Available == 10
	})
	if again := f.reserve("cal", "again", 1); again.Outcome != engine.OutcomeReserved {
		t.Fatalf("cal after the cancel: %s, want the quota back", again.Outcome)
	}
	f.assertConserved()
}

// A retry of a request whose cancel the ledger took but whose release Redis
// never ran (every try of it lost) is answered EXPIRED, and gives back what
// Redis still holds of that placement: the buyer may reserve again at once,
// instead of meeting LIMIT_EXCEEDED until the reservation's expiry.
func TestARetryOfACancelledRequestGivesBackWhatRedisHolds(t *testing.T) {
	rdb, lost := withLostReplies(t, backends()[0])
	f := newFixture(t, rdb, withAllocation(10), withShards(1), withTTL(time.Hour, 0), withMaxPerUser(1))
	ctx := context.Background()
	r := f.reserve("cal", "r", 1).Reservation
	lost.armDrop(1<<30, isScript(t, "cancel"))
	if out, err := f.e.Cancel(ctx, "cal", r.ID); err != nil || out.Outcome != ledger.CancelCancelled {
		t.Fatalf("cancel: %+v %v", out.Outcome, err)
	}
	if again := f.reserve("cal", "other", 1); again.Outcome != engine.OutcomeLimit {
		t.Fatalf("a new request before the retry: %s, want LIMIT_EXCEEDED (the cancel's release lost)", again.Outcome)
	}
	if retry := f.reserve("cal", "r", 1); retry.Outcome != engine.OutcomeExpired {
		t.Fatalf("the cancelled request's retry: %s, want EXPIRED", retry.Outcome)
	}
	if again := f.reserve("cal", "other", 1); again.Outcome != engine.OutcomeReserved {
		t.Fatalf("a new request after the retry: %s, want the quota back", again.Outcome)
	}
	lost.arm(0, nil)
	f.assertConserved()
}

// The marks kept to try again are bounded, those a round is trying
// included: a Redis that stalls holds a round at its first mark, and the
// marks that came meanwhile must not be added on top of those taken out.
func TestLaterMarksStayBounded(t *testing.T) {
	r := testharness.RedisT(t)
	admin := standaloneClient(t, r.Addr())
	f := newFixture(t, standaloneClient(t, r.Addr()), withShards(1), withAllocation(5), withTTL(time.Hour, 0))
	ctx := context.Background()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
			t.Error(err)
		}
	}()
	until := time.Now().Add(time.Hour)
	for i := range 2 * engine.LaterMarksMax {
		if i == engine.LaterMarksMax {
			// The first round takes them out, and waits on the stalled server.
			testharness.Eventually(t, 10*time.Second, "a round under way", func() bool {
				_, trying := f.e.LaterMarks()
				return trying > 0
			})
		}
		f.e.MarkLater(0, fmt.Sprintf("k-%d", i), "u", until)
	}
	if kept, _ := f.e.LaterMarks(); kept > engine.LaterMarksMax {
		t.Fatalf("%d marks kept, want at most %d", kept, engine.LaterMarksMax)
	}
}

// A cancel of a reservation stolen from its buyer's home shard whose
// release ran but whose answer was lost: the try again answers NOT_FOUND,
// which names no buyer. The quota on the home shard is given back from the
// ledger's row, named by the placement, instead of being held until the
// reaper (TTL + grace + a minute) with the unit already back in stock.
func TestACancelOfAStolenReservationWhoseAnswerWasLostGivesTheQuotaBack(t *testing.T) {
	for _, drop := range []struct {
		name   string
		script string
		lose   func(l *lostReply, n int, match func(args []any) bool)
	}{
		{"cancel's answer", "cancel", (*lostReply).arm},
		{"the quota's give-back", "quota", (*lostReply).armDrop},
	} {
		t.Run(drop.name, func(t *testing.T) {
			rdb, lost := withLostReplies(t, backends()[0])
			f := newFixture(t, rdb, withAllocation(4), withShards(2), withSteal(1), withMaxPerUser(1), withTTL(time.Hour, 0))
			ctx := context.Background()
			f.sellOutShard(1)
			buyer := userHomedOn("buyer", 1, 2)
			r := f.reserve(buyer, "r", 1)
			if r.Outcome != engine.OutcomeReserved || r.Reservation.Shard != 0 {
				t.Fatalf("reserve: %+v, want reserved on shard 0 (stolen)", r)
			}
			drop.lose(lost, 1, isScript(t, drop.script))
			if out, err := f.e.Cancel(ctx, buyer, r.Reservation.ID); err != nil || out.Outcome != ledger.CancelCancelled {
				t.Fatalf("cancel: %+v %v", out.Outcome, err)
			}
			if lost.count() != 1 {
				t.Fatalf("%d %s calls lost, want 1", lost.count(), drop.script)
			}
			testharness.Eventually(t, 10*time.Second, "the buyer's quota back", func() bool {
				n, err := rdb.HGet(ctx, f.e.Store().Keys(1).Users(), buyer).Int64()
				return errors.Is(err, redis.Nil) || (err == nil && n == 0)
			})
			if again := f.reserve(buyer, "again", 1); again.Outcome != engine.OutcomeReserved {
				t.Fatalf("%s after the cancel: %s, want the quota back", buyer, again.Outcome)
			}
			f.assertQuotaCovers()
			f.assertConserved()
		})
	}
}
