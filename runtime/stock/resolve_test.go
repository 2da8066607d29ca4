package stock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Resolve tells an attempt its own claim by the tag in the claim's stamp,
// finds a reservation of the key, and otherwise fences the attempt: its call
// arriving late then takes nothing, while other attempts of the same request
// go through. A claim stamped without a tag (made before tags) is still
// confirmed and reaped by its stamp.
func TestResolveFindsOrFences(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	s := stock.New(rdb, "c-resolve-"+randomID(), 2)
	for i := range 2 {
		if _, err := s.Seed(ctx, i, int64(i), 1, stock.StateOpen, 0); err != nil {
			t.Fatal(err)
		}
	}
	r := stock.ReserveRequest{Shard: 0, Home: 0, Mode: stock.ModeClaim, User: "u", Key: "k",
		Quantity: 1, MaxPerUser: 1, TTL: time.Minute, Attempt: "a1"}
	c, err := s.Reserve(ctx, r)
	if err != nil || c.Code != stock.Claimed {
		t.Fatalf("claim: %+v %v", c, err)
	}
	if got, err := s.Resolve(ctx, 0, "k", "a1"); err != nil || got.Claim != c.Status || got.Held != 0 || got.Placed {
		t.Fatalf("resolve of the claiming attempt: %+v %v, want its claim %q", got, err, c.Status)
	}
	// Another attempt of the same request: not its claim, so it is fenced.
	if got, err := s.Resolve(ctx, 0, "k", "a2"); err != nil || got.Claim != "" || got.Placed {
		t.Fatalf("resolve of another attempt: %+v %v, want nothing", got, err)
	}
	r2 := r
	r2.Attempt = "a2"
	if late, err := s.Reserve(ctx, r2); err != nil || late.Code != stock.Busy || late.Status != "FENCED" {
		t.Fatalf("the fenced attempt arriving late: %+v %v, want BUSY FENCED", late, err)
	}
	if ttl, err := rdb.TTL(ctx, s.Keys(0).Res("k")).Result(); err != nil || ttl <= 0 || ttl > stock.FenceTTL {
		t.Fatalf("the fence's lifetime: %v %v", ttl, err)
	}
	// The claim places on shard 1, where the claiming attempt finds it.
	steal := r
	steal.Shard, steal.Mode = 1, stock.ModeSteal
	placed, err := s.Reserve(ctx, steal)
	if err != nil || placed.Code != stock.Reserved {
		t.Fatalf("steal: %+v %v", placed, err)
	}
	got, err := s.Resolve(ctx, 1, "k", "a1")
	if res := got.Reservation; err != nil || !got.Placed || res.ExpiryMs != placed.ExpiryMs || res.User != "u" || res.Home != 0 || res.Quantity != 1 || res.Status != stock.ResReserved {
		t.Fatalf("resolve on the target: %+v %v", got, err)
	}
	if ok, err := s.ConfirmClaim(ctx, 0, "k", c.Status, 1, placed.ExpiryMs); err != nil || !ok {
		t.Fatalf("confirm with the tagged stamp: %v %v", ok, err)
	}
	if _, err := s.Resolve(ctx, 0, "k", ""); err == nil {
		t.Fatal("resolve without a tag: no error")
	}

	// An untagged claim (the stamp is the time alone) is confirmed by it.
	r.Key, r.User, r.Attempt = "old", "v", ""
	old, err := s.Reserve(ctx, r)
	if err != nil || old.Code != stock.Claimed {
		t.Fatalf("untagged claim: %+v %v", old, err)
	}
	if ok, err := s.Unclaim(ctx, 0, "old", old.Status+".x"); err != nil || ok {
		t.Fatalf("unclaim naming another stamp: %v %v, want no change", ok, err)
	}
	if ok, _, err := s.ReapClaim(ctx, 0, "old", time.Now().Add(time.Hour)); err != nil || !ok {
		t.Fatalf("reap of the untagged claim: %v %v", ok, err)
	}
	if n, err := rdb.HGet(ctx, s.Keys(0).Users(), "v").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("v's quota after the reap: %q %v, want none", n, err)
	}
	// A tagged claim is reaped by its time too.
	r.Attempt = "a3"
	if c, err := s.Reserve(ctx, r); err != nil || c.Code != stock.Claimed {
		t.Fatalf("tagged claim: %+v %v", c, err)
	}
	if ok, _, err := s.ReapClaim(ctx, 0, "old", time.Now().Add(time.Hour)); err != nil || !ok {
		t.Fatalf("reap of the tagged claim: %v %v", ok, err)
	}
}
