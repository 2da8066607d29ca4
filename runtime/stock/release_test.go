package stock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A give-back that names its placement takes only that one: another
// placement of the same request (a retry's, after a rebuild) is left whole.
func TestReleasePlacedLeavesAnotherPlacement(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := stock.New(rdb, "placed-"+t.Name(), 1)
	if err := seed(5)(ctx, s); err != nil {
		t.Fatal(err)
	}
	placed, err := s.Reserve(ctx, req(stock.ModeHome))
	if err != nil || placed.Code != stock.Reserved {
		t.Fatalf("reserve: %+v %v", placed, err)
	}
	for _, other := range [][2]int64{{placed.ExpiryMs + 1, placed.Epoch}, {placed.ExpiryMs, placed.Epoch + 1}} {
		rr, err := s.ReleasePlaced(ctx, 0, key, other[0], other[1])
		if err != nil || rr.Code != stock.NotThis {
			t.Fatalf("release naming expiry %d epoch %d: %+v %v; want NotThis", other[0], other[1], rr, err)
		}
	}
	if st, err := s.State(ctx); err != nil || st[0].Available != 4 || st[0].Reserved != 1 {
		t.Fatalf("stock after the other placements' give-backs: %+v %v; want 4", st, err)
	}
	rr, err := s.ReleasePlaced(ctx, 0, key, placed.ExpiryMs, placed.Epoch)
	if err != nil || rr.Code != stock.Released || rr.Quantity != 1 {
		t.Fatalf("release of its own placement: %+v %v; want released", rr, err)
	}
	if st, err := s.State(ctx); err != nil || st[0].Available != 5 || st[0].Reserved != 0 {
		t.Fatalf("stock after the give-back: %+v %v; want 5", st, err)
	}
}

// QuotaEach refuses a batch naming an operation it does not know, whole:
// every give gets the error, and none is sent, not even the valid ones.
func TestQuotaEachRefusesAnUnknownOperation(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	s := stock.New(rdb, "quota-each-"+randomID(), 2)
	if err := then(seed(0), reserved(stock.Claimed, stock.ModeClaim), quota("confirm"))(ctx, s); err != nil {
		t.Fatal(err)
	}
	held := func() string {
		t.Helper()
		n, err := rdb.HGet(ctx, s.Keys(0).Users(), user).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return n
	}
	give := stock.QuotaGive{Op: stock.QuotaRelease, User: user, Key: key, Quantity: 1, Shard: 1, ExpiryMs: placedExpiry}
	bad := give
	bad.Op = "give"
	changed, errs := s.QuotaEach(ctx, 0, []stock.QuotaGive{give, bad})
	for i := range 2 {
		if errs[i] == nil || !strings.Contains(errs[i].Error(), `unknown operation "give"`) || changed[i] {
			t.Errorf("give %d: changed %v, %v; want the unknown operation named", i, changed[i], errs[i])
		}
	}
	if n := held(); n != "1" {
		t.Fatalf("the buyer's quota after the refused batch: %q; want 1 (nothing sent)", n)
	}
	changed, errs = s.QuotaEach(ctx, 0, []stock.QuotaGive{give})
	if errs[0] != nil || !changed[0] {
		t.Fatalf("the valid give alone: changed %v, %v", changed[0], errs[0])
	}
	if n := held(); n != "" {
		t.Fatalf("the buyer's quota after the give-back: %q; want none", n)
	}
}
