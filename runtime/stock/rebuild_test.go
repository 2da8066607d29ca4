package stock_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// TestOvertakenRebuildWritesNothing: two rebuilds of one shard overlap (two
// managers that both believed they led). Once the newer one has begun, the
// older one's reservations, quota fields and meta are refused, so nothing
// from its older ledger snapshot lands in the newer rebuild.
func TestOvertakenRebuildWritesNothing(t *testing.T) {
	_, rdb := standalone(t)
	s := openSale(t, rdb, "c-"+randomID(), 1, 10)
	ctx := context.Background()
	old := stock.Reservation{Key: "old-snapshot", User: "ann", Quantity: 1, Status: stock.ResReserved,
		ExpiryMs: time.Now().Add(time.Minute).UnixMilli(), Epoch: 1, Home: 0}
	if err := s.RebuildBegin(ctx, 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := s.RebuildBegin(ctx, 0, 6); err != nil {
		t.Fatal(err)
	}
	if err := s.RebuildRestore(ctx, 0, 5, []stock.Reservation{old}); err == nil {
		t.Fatal("the overtaken rebuild restored a reservation")
	}
	if err := s.RebuildUsers(ctx, 0, 5, []string{"ann", "1"}); err == nil {
		t.Fatal("the overtaken rebuild restored a quota")
	}
	if err := s.RebuildFinish(ctx, 0, 10, 5, stock.StateOpen, 10, 0); err == nil {
		t.Fatal("the overtaken rebuild opened the shard")
	}
	if n, err := rdb.Exists(ctx, s.Keys(0).Res(old.Key), s.Keys(0).Users()).Result(); err != nil || n != 0 {
		t.Fatalf("%d keys of the overtaken rebuild exist (%v)", n, err)
	}
	// The newer rebuild's own steps go through, and it opens the shard with
	// what it restored.
	if err := s.RebuildRestore(ctx, 0, 6, []stock.Reservation{old}); err != nil {
		t.Fatal(err)
	}
	if err := s.RebuildUsers(ctx, 0, 6, []string{"ann", "1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.RebuildFinish(ctx, 0, 9, 6, stock.StateOpen, 10, 0); err != nil {
		t.Fatal(err)
	}
	states, err := s.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := states[0]; st.State != stock.StateOpen || st.Epoch != 6 || st.Available != 9 || st.Reserved != 1 {
		t.Fatalf("after the newer rebuild: %+v", st)
	}
}
