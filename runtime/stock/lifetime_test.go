package stock_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A held reservation's hash has no TTL, however it was written (placed on a
// key whose fences have one, or restored by a rebuild): the sweeper may come
// late, and the hash says what to give back. What is left of it once it
// ends has one: a paid one the backstop's, fences left by a release or a
// cancel the fences' own.
func TestAHeldReservationsHashLivesUntilItEnds(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	const backstop = time.Hour
	s := openSale(t, rdb, "c-"+randomID(), 1, 10).WithBackstop(backstop)
	ttl := func(key string) time.Duration {
		t.Helper()
		d, err := rdb.TTL(ctx, s.Keys(0).Res(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	place := func(user, key, attempt string) {
		t.Helper()
		r, err := s.Reserve(ctx, stock.ReserveRequest{Shard: 0, Home: 0, Mode: stock.ModeHome, User: user, Key: key,
			Quantity: 1, MaxPerUser: 1, TTL: time.Minute, Attempt: attempt})
		if err != nil || r.Code != stock.Reserved {
			t.Fatalf("reserve %s: %+v %v", key, r, err)
		}
	}

	place("ann", "paid", "a1")
	if d := ttl("paid"); d != -1 {
		t.Fatalf("a held reservation's hash has TTL %v, want none", d)
	}
	if n, err := s.MarkCommitted(ctx, 0, "paid"); err != nil || n != 1 {
		t.Fatalf("commit mark: %d %v", n, err)
	}
	if d := ttl("paid"); d <= backstop-time.Minute || d > backstop {
		t.Fatalf("a paid reservation's hash has TTL %v, want the backstop %v", d, backstop)
	}

	// A lost reply fenced attempt f1 of a request that had placed nothing;
	// another attempt places it: the fence's lifetime must not take it away.
	if got, err := s.Resolve(ctx, 0, "fenced", "f1"); err != nil || got.Placed {
		t.Fatalf("resolve: %+v %v", got, err)
	}
	place("bob", "fenced", "f2")
	if d := ttl("fenced"); d != -1 {
		t.Fatalf("a reservation placed on a fenced key has TTL %v, want none", d)
	}
	// Released, the fence stays for its own lifetime.
	if r, err := s.Release(ctx, 0, "fenced"); err != nil || r.Code != stock.Released {
		t.Fatalf("release: %+v %v", r, err)
	}
	if d := ttl("fenced"); d <= stock.FenceTTL-time.Minute || d > stock.FenceTTL {
		t.Fatalf("the fences a release left have TTL %v, want %v", d, stock.FenceTTL)
	}

	// The same for a cancel, of a reservation fenced after it was placed.
	place("cy", "cancelled", "c1")
	if got, err := s.Resolve(ctx, 0, "cancelled", "c2"); err != nil || !got.Placed {
		t.Fatalf("resolve: %+v %v", got, err)
	}
	if d := ttl("cancelled"); d != -1 {
		t.Fatalf("a fenced held reservation has TTL %v, want none", d)
	}
	if r, err := s.Cancel(ctx, 0, "cancelled", "cy"); err != nil || r.Code != stock.Released {
		t.Fatalf("cancel: %+v %v", r, err)
	}
	if d := ttl("cancelled"); d <= stock.FenceTTL-time.Minute || d > stock.FenceTTL {
		t.Fatalf("the fences a cancel left have TTL %v, want %v", d, stock.FenceTTL)
	}

	// A rebuild restores a held reservation without a TTL (on a key that
	// holds a fence), a paid one with what is left of the backstop.
	if got, err := s.Resolve(ctx, 0, "restored", "r1"); err != nil || got.Placed {
		t.Fatalf("resolve: %+v %v", got, err)
	}
	if err := s.RebuildBegin(ctx, 0, 2); err != nil {
		t.Fatal(err)
	}
	expiry := time.Now().Add(time.Minute).UnixMilli()
	if err := s.RebuildRestore(ctx, 0, 2, []stock.Reservation{
		{Key: "restored", User: "dee", Quantity: 1, Status: stock.ResReserved, ExpiryMs: expiry, Epoch: 2},
		{Key: "restored-paid", User: "eve", Quantity: 1, Status: stock.ResCommitted, ExpiryMs: expiry, Epoch: 2,
			CreatedMs: time.Now().UnixMilli()},
	}); err != nil {
		t.Fatal(err)
	}
	if d := ttl("restored"); d != -1 {
		t.Fatalf("a restored held reservation has TTL %v, want none", d)
	}
	if d := ttl("restored-paid"); d <= backstop-time.Minute || d > backstop {
		t.Fatalf("a restored paid reservation has TTL %v, want the backstop %v", d, backstop)
	}
}
