package engine_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// isCommitMark matches commit.lua's call (EVALSHA sha 4 meta index res
// paying key ...): the checkout's Redis step after its ledger commit.
func isCommitMark(args []any) bool {
	if len(args) < 7 {
		return false
	}
	name, _ := args[0].(string)
	nkeys, _ := strconv.Atoi(fmt.Sprint(args[2]))
	if !strings.HasPrefix(strings.ToLower(name), "eval") || nkeys != 4 {
		return false
	}
	meta, _ := args[3].(string)
	paying, _ := args[6].(string)
	return strings.HasSuffix(meta, ":meta") && strings.HasSuffix(paying, ":paying")
}

// A checkout whose Redis step is lost after its ledger commit (the command
// never reaches Redis) leaves the unit sold in the ledger and reserved in
// Redis; the next sweep settles it, long before the reservation's expiry,
// and the counts are exact again, on standalone Redis and on the cluster.
func TestSweepSettlesACheckoutCutOffAfterItsLedgerCommit(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			rdb, lost := withLostReplies(t, b)
			f := newFixture(t, rdb, withAllocation(40), withShards(4), withTTL(10*time.Minute, 30*time.Second))
			ctx := context.Background()
			r := f.reserve("paula", "r", 1)
			lost.armDrop(1, isCommitMark)
			co, err := f.e.Checkout(ctx, "paula", r.Reservation.ID, "pay-1")
			if err != nil || co.Outcome != ledger.CheckoutCommitted {
				t.Fatalf("checkout: %v %v", co.Outcome, err)
			}
			if lost.count() != 1 {
				t.Fatalf("%d commit marks lost, want the checkout's", lost.count())
			}
			if c := f.counts(); c.Sold != 1 || c.Reserved != 1 {
				t.Fatalf("after the cut-off checkout: %+v, want the unit both sold and reserved", c)
			}
			st, err := f.e.Sweep(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c := f.assertConserved()
			if c.Reserved != 0 || c.Sold != 1 || st.Committed != 1 {
				t.Fatalf("one sweep (%+v) after the cut-off checkout: %+v", st, c)
			}
			shard, key, _ := stock.ParseID(r.Reservation.ID, f.cfg.Shards)
			if p, err := f.e.Store().PayingEntries(ctx, shard, 0, 10); err != nil || len(p) != 0 {
				t.Fatalf("paying marks left: %v %v", p, err)
			}
			if s, err := rdb.HGet(ctx, f.e.Store().Keys(shard).Res(key), "s").Result(); err != nil || s != "C" {
				t.Fatalf("the reservation in Redis: %q %v, want committed", s, err)
			}
		})
	}
}

// A checkout that does not commit leaves no mark: another buyer's marks
// nothing, a refused one (here: after expiry) takes its mark back. A mark
// whose checkout died before its ledger commit is dropped by the sweep once
// it is engine.PayingHold old, the reservation left as it was; a younger one
// stays (its checkout may still commit).
func TestPayingMarksOfCheckoutsThatDidNotCommit(t *testing.T) {
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(10), withShards(2), withTTL(shortTTL, time.Minute))
	ctx := context.Background()
	late := f.reserve("lena", "r", 1)
	lateShard, _, _ := stock.ParseID(late.Reservation.ID, f.cfg.Shards)
	if co, err := f.e.Checkout(ctx, "mallory", late.Reservation.ID, "pay-x"); err != nil || co.Outcome == ledger.CheckoutCommitted {
		t.Fatalf("another buyer's checkout: %v %v", co.Outcome, err)
	}
	if m := marksOf(t, f, lateShard); len(m) != 0 {
		t.Fatalf("another buyer's checkout left marks %v", m)
	}
	time.Sleep(shortTTL + 100*time.Millisecond)
	if co, err := f.e.Checkout(ctx, "lena", late.Reservation.ID, "pay-late"); err != nil || co.Outcome != ledger.CheckoutExpired {
		t.Fatalf("late checkout: %v %v", co.Outcome, err)
	}
	if m := marksOf(t, f, lateShard); len(m) != 0 {
		t.Fatalf("a refused checkout left marks %v", m)
	}

	// Marks as a checkout killed before its ledger commit leaves them: one
	// older than the hold, one just made.
	f2 := newFixture(t, rdb, withAllocation(10), withShards(1), withTTL(10*time.Minute, 0))
	old, young := f2.reserve("olga", "r", 1), f2.reserve("yann", "r", 1)
	now, err := f2.e.Store().Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k := f2.e.Store().Keys(0)
	_, oldKey, _ := stock.ParseID(old.Reservation.ID, 1)
	_, youngKey, _ := stock.ParseID(young.Reservation.ID, 1)
	if err := rdb.ZAdd(ctx, k.Paying(),
		redis.Z{Score: float64(now.Add(-engine.PayingHold - time.Second).UnixMilli()), Member: oldKey},
		redis.Z{Score: float64(now.UnixMilli()), Member: youngKey}).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := f2.e.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, f2, 0); len(m) != 1 || m[0].Key != youngKey {
		t.Fatalf("marks after the sweep: %v, want the young one only", m)
	}
	if c := f2.counts(); c.Reserved != 2 || c.Sold != 0 {
		t.Fatalf("counts %+v: both reservations must still be held", c)
	}
}

func marksOf(t *testing.T, f *fixture, shard int) []stock.Paying {
	t.Helper()
	p, err := f.e.Store().PayingEntries(context.Background(), shard, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
