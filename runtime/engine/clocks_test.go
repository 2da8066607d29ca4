package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// ClockSkew reads how far the ledger's clock is from the clock of the Redis
// servers holding the shards, in both directions, and what that does: with
// the database's clock ahead by the TTL, a reservation made a moment ago is
// answered "expired" at checkout.
func TestClockSkewReadsTheLedgerAgainstRedis(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		dsn, err := sharedPG.NewDatabase()
		if err != nil {
			t.Fatal(err)
		}
		shift := testharness.SkewClock(ctx, t, dsn)
		l, err := ledger.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		cfg := engine.Config{
			CampaignID: "c-" + randomID(), Namespace: "shop", Name: "drop", SKU: "itm-ps5-pro",
			Allocation: 10, Shards: 4, MaxPerUser: 1, TTL: 10 * time.Second, StealProbes: 2,
			IDSecret: []byte("0123456789abcdef0123456789abcdef"),
		}
		e := openEngine(t, cfg, rdb, l)
		if _, err := e.Seed(ctx, stock.StateOpen); err != nil {
			t.Fatal(err)
		}

		for _, c := range []struct {
			offset string
			want   time.Duration
		}{{"0", 0}, {"5 seconds", 5 * time.Second}, {"-3 seconds", -3 * time.Second}, {"10 seconds", 10 * time.Second}} {
			shift(c.offset)
			skew, err := e.ClockSkew(ctx)
			if err != nil {
				t.Fatalf("ledger clock %s: %v", c.offset, err)
			}
			// One host's clock on both sides: the difference is the
			// offset, within the round trips and a scheduling delay.
			if d := (skew.Ahead - c.want).Abs(); d > skew.Uncertainty+50*time.Millisecond || skew.Server == "" {
				t.Fatalf("ledger clock %s: read %+v, want %s ahead", c.offset, skew, c.want)
			}
		}

		// Ahead by the TTL: a reservation just made has expired by the
		// ledger's clock.
		r, err := e.Reserve(ctx, "bob", "r1", 1)
		if err != nil || r.Outcome != engine.OutcomeReserved {
			t.Fatalf("reserve: %+v, %v", r, err)
		}
		out, err := e.Checkout(ctx, "bob", r.Reservation.ID, "pay-1")
		if err != nil || out.Outcome != ledger.CheckoutExpired {
			t.Fatalf("checkout a moment after the reservation, the ledger's clock a TTL ahead: %+v, %v; want expired", out, err)
		}
	})
}
