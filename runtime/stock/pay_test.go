package stock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// The paying index holds the buyer's own RESERVED reservations only; a drop
// names its mark, so it leaves a later checkout's; every outcome of the
// commit mark takes the reservation out of the index.
func TestPayingIndex(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := stock.New(rdb, "pay-"+t.Name(), 2)
	if err := seed(5)(ctx, s); err != nil {
		t.Fatal(err)
	}
	entries := func() []stock.Paying {
		t.Helper()
		p, err := s.PayingEntries(ctx, 0, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if at, err := s.MarkPaying(ctx, 0, key, user); err != nil || at != 0 || len(entries()) != 0 {
		t.Fatalf("mark without a reservation: %d %v, %v; want nothing marked", at, err, entries())
	}
	if _, err := s.Reserve(ctx, req(stock.ModeHome)); err != nil {
		t.Fatal(err)
	}
	if at, err := s.MarkPaying(ctx, 0, key, "someone-else"); err != nil || at != 0 || len(entries()) != 0 {
		t.Fatalf("another buyer's mark: %d %v, %v; want nothing marked", at, err, entries())
	}
	first, err := s.MarkPaying(ctx, 0, key, user)
	if err != nil || first == 0 {
		t.Fatalf("mark: %d %v", first, err)
	}
	if p := entries(); len(p) != 1 || p[0].Key != key || p[0].AtMs != first {
		t.Fatalf("entries %v, want %s at %d", p, key, first)
	}
	// A later mark (a retried checkout) moves the entry: the first one's
	// drop leaves it.
	var second int64
	for second <= first {
		time.Sleep(2 * time.Millisecond)
		if second, err = s.MarkPaying(ctx, 0, key, user); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := s.DropPaying(ctx, 0, key, first); err != nil || ok || len(entries()) != 1 {
		t.Fatalf("the first mark's drop after a second mark: %v %v, %v; want it left", ok, err, entries())
	}
	if ok, err := s.DropPaying(ctx, 0, key, second); err != nil || !ok || len(entries()) != 0 {
		t.Fatalf("the second mark's drop: %v %v, %v; want it gone", ok, err, entries())
	}
	if ok, err := s.DropPaying(ctx, 0, key, second); err != nil || ok {
		t.Fatalf("the drop again: %v %v; want nothing done", ok, err)
	}
	if _, err := s.MarkPaying(ctx, 0, key, user); err != nil {
		t.Fatal(err)
	}
	if n, err := s.MarkCommitted(ctx, 0, key); err != nil || n != 1 || len(entries()) != 0 {
		t.Fatalf("commit mark: %d %v, entries %v; want marked and the entry gone", n, err, entries())
	}
	if at, err := s.MarkPaying(ctx, 0, key, user); err != nil || at != 0 {
		t.Fatalf("mark of a committed reservation: %d %v; want nothing marked", at, err)
	}
}
