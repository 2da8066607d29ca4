package stock_test

import (
	"context"
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
