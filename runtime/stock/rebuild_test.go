package stock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// TestCommitDuringARebuildChangesNothing: a checkout's ledger commit lands
// while a rebuild wipes the shard, between two of its wipe calls, and its
// Redis mark reaches a reservation the wipe has not deleted yet. The rebuild
// began the shard's reserved count at zero and counts only what the ledger
// says is pending, which no longer includes the sold one: a mark that took
// its unit off that count would leave the shard's reserved count one short
// for good (I2). The mark must change nothing and say why.
func TestCommitDuringARebuildChangesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		s := openSale(t, rdb, "c-"+randomID(), 1, 10)
		ctx := context.Background()
		var keys []string
		for _, user := range []string{"ann", "bob"} {
			if r, err := reserveHome(ctx, s, user); err != nil || r.Code != stock.Reserved {
				t.Fatalf("reserve for %s: %+v %v", user, r, err)
			}
			keys = append(keys, "k-"+user)
		}
		const epoch = 7
		if left, err := s.RebuildBeginStep(ctx, 0, epoch, 1); err != nil || left != 1 {
			t.Fatalf("first wipe call: %d left, %v; want 1", left, err)
		}
		// The one the wipe has not reached yet is sold.
		sold := keys[0]
		if n, err := rdb.Exists(ctx, s.Keys(0).Res(sold)).Result(); err != nil || n == 0 {
			sold = keys[1]
		}
		if n, err := s.MarkCommitted(ctx, 0, sold); err != nil || n != stock.CommitRebuilding {
			t.Fatalf("commit mark during the rebuild: %d, %v; want %d (CommitRebuilding)", n, err, stock.CommitRebuilding)
		}
		if st, err := rdb.HGet(ctx, s.Keys(0).Res(sold), "s").Result(); err != nil || st != "R" {
			t.Fatalf("the mark changed the reservation during the rebuild: status %q, %v", st, err)
		}
		// The rebuild goes on from the ledger: the other reservation pending,
		// the sold one sold.
		if err := s.RebuildBegin(ctx, 0, epoch); err != nil {
			t.Fatal(err)
		}
		other := keys[0]
		if other == sold {
			other = keys[1]
		}
		user := "ann"
		if other == "k-bob" {
			user = "bob"
		}
		pending := stock.Reservation{Key: other, User: user, Quantity: 1, Status: stock.ResReserved,
			ExpiryMs: time.Now().Add(time.Minute).UnixMilli(), Epoch: epoch, Home: 0}
		if err := s.RebuildRestore(ctx, 0, epoch, []stock.Reservation{pending}); err != nil {
			t.Fatal(err)
		}
		if err := s.RebuildFinish(ctx, 0, 8, epoch, stock.StateOpen, 10, 0); err != nil {
			t.Fatal(err)
		}
		if available, reserved := totals(t, s); available != 8 || reserved != 1 {
			t.Fatalf("after the rebuild: available %d, reserved %d; want 8 and 1 (one sold, one pending)", available, reserved)
		}
		// After it, the mark goes through (the sweeper's repair) and finds
		// nothing of the sold reservation left to count.
		if n, err := s.MarkCommitted(ctx, 0, sold); err != nil || n != 0 {
			t.Fatalf("commit mark after the rebuild: %d, %v; want 0 (wiped)", n, err)
		}
		if available, reserved := totals(t, s); available != 8 || reserved != 1 {
			t.Fatalf("after the late mark: available %d, reserved %d; want 8 and 1", available, reserved)
		}
	})
}
