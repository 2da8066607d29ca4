package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

func TestReserveCheckoutCancel(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(10), withShards(3))
		ctx := context.Background()

		r := f.reserve("alice", "req-1", 1)
		if r.Outcome != engine.OutcomeReserved {
			t.Fatalf("outcome %s, want RESERVED", r.Outcome)
		}
		if time.Until(r.Reservation.ExpiresAt) < 50*time.Second || time.Until(r.Reservation.ExpiresAt) > 61*time.Second {
			t.Fatalf("expiry %s is not about a TTL away", r.Reservation.ExpiresAt)
		}
		o, err := f.l.GetOrder(ctx, f.e.Config().CampaignID, r.Reservation.ID)
		if err != nil || o.Status != ledger.StatusPending || o.UserID != "alice" {
			t.Fatalf("ledger row %+v, %v", o, err)
		}

		// Another user's checkout of alice's reservation reveals nothing.
		co, err := f.e.Checkout(ctx, "mallory", r.Reservation.ID, "pay-x")
		if err != nil || co.Outcome != ledger.CheckoutNotFound {
			t.Fatalf("foreign checkout: %v %v", co.Outcome, err)
		}
		co, err = f.e.Checkout(ctx, "alice", r.Reservation.ID, "pay-1")
		if err != nil || co.Outcome != ledger.CheckoutCommitted {
			t.Fatalf("checkout: %v %v", co.Outcome, err)
		}
		co, _ = f.e.Checkout(ctx, "alice", r.Reservation.ID, "pay-1")
		if co.Outcome != ledger.CheckoutAlreadyCommitted {
			t.Fatalf("same token again: %v", co.Outcome)
		}
		co, _ = f.e.Checkout(ctx, "alice", r.Reservation.ID, "pay-2")
		if co.Outcome != ledger.CheckoutConflict {
			t.Fatalf("second token: %v", co.Outcome)
		}
		if c, _ := f.e.Cancel(ctx, "alice", r.Reservation.ID); c.Outcome != ledger.CancelCommitted {
			t.Fatalf("cancel after commit: %v", c.Outcome)
		}

		b := f.reserve("bob", "req-1", 1)
		if b.Outcome != engine.OutcomeReserved || b.Reservation.ID == r.Reservation.ID {
			t.Fatalf("bob: %+v", b)
		}
		if c, err := f.e.Cancel(ctx, "alice", b.Reservation.ID); err != nil || c.Outcome != ledger.CancelNotFound {
			t.Fatalf("alice cancelling bob's: %v %v", c.Outcome, err)
		}
		if c, err := f.e.Cancel(ctx, "bob", b.Reservation.ID); err != nil || c.Outcome != ledger.CancelCancelled {
			t.Fatalf("cancel: %v %v", c.Outcome, err)
		}
		if c, _ := f.e.Cancel(ctx, "bob", b.Reservation.ID); c.Outcome != ledger.CancelAlreadyCancelled {
			t.Fatalf("cancel twice: %v", c.Outcome)
		}
		c := f.assertConserved()
		if c.Sold != 1 || c.Reserved != 0 || c.Available != 9 {
			t.Fatalf("counts %+v", c)
		}
	})
}

func TestBadInputChangesNothing(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(10), withMaxPerUser(2))
	ctx := context.Background()
	before := f.counts()
	for _, tc := range []struct {
		name      string
		user, req string
		qty       int
	}{
		{"quantity zero", "u", "r", 0},
		{"quantity above maxPerUser", "u", "r", 3},
		{"negative quantity", "u", "r", -1},
		{"no user", "", "r", 1},
		{"no request id", "u", "", 1},
		// The prefix of the pointers in a shard's users hash: a buyer so named
		// would share a field with a request's pointer.
		{"user id with the pointer prefix", stock.PointerFieldPrefix + "k", "r", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.e.Reserve(ctx, tc.user, tc.req, tc.qty)
			if !errors.Is(err, engine.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
	for _, id := range []string{"", "x", "99.AAAAAAAAAAAAAAAAAAAAAA", "1.short", "-1.AAAAAAAAAAAAAAAAAAAAAA", "01.AAAAAAAAAAAAAAAAAAAAAA"} {
		if co, err := f.e.Checkout(ctx, "u", id, "pay"); err != nil || co.Outcome != ledger.CheckoutNotFound {
			t.Fatalf("checkout %q: %v %v", id, co.Outcome, err)
		}
		if c, err := f.e.Cancel(ctx, "u", id); err != nil || c.Outcome != ledger.CancelNotFound {
			t.Fatalf("cancel %q: %v %v", id, c.Outcome, err)
		}
	}
	if after := f.counts(); after.Available != before.Available || after.Reserved != 0 || after.Pending != 0 {
		t.Fatalf("bad input changed state: %+v -> %+v", before, after)
	}
}

// I4: the same user and request id, many times at once: one reservation, one unit.
func TestIdempotentReplay(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(50), withMaxPerUser(5))
		var wg sync.WaitGroup
		results := make([]engine.ReserveResult, 40)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := f.e.Reserve(context.Background(), "carol", "same-key", 2)
				if err != nil {
					t.Error(err)
				}
				results[i] = r
			}()
		}
		wg.Wait()
		id, reserved := "", 0
		for _, r := range results {
			switch r.Outcome {
			case engine.OutcomeReserved:
				reserved++
				fallthrough
			case engine.OutcomeReplayed:
				if id == "" {
					id = r.Reservation.ID
				}
				if r.Reservation.ID != id {
					t.Fatalf("two reservation ids for one request: %s, %s", id, r.Reservation.ID)
				}
			case engine.OutcomeBusy:
			default:
				t.Fatalf("unexpected outcome %s", r.Outcome)
			}
		}
		if reserved != 1 {
			t.Fatalf("%d new reservations for one request, want 1", reserved)
		}
		again := f.reserve("carol", "same-key", 2)
		if again.Outcome != engine.OutcomeReplayed || again.Reservation.ID != id || !again.Reservation.ExpiresAt.Equal(results[0].Reservation.ExpiresAt) && results[0].Outcome != engine.OutcomeBusy {
			t.Fatalf("replay %+v", again)
		}
		c := f.assertConserved()
		if c.Reserved != 2 {
			t.Fatalf("reserved %d units, want 2", c.Reserved)
		}
	})
}

// I5: one user hammering with many request ids at once, with the home shard sold
// out so that reservations are stolen from other shards: never more than maxPerUser.
func TestPerUserLimitAcrossShards(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(40), withShards(4), withMaxPerUser(3))
		ctx := context.Background()
		const user = "dave"
		home := stock.HomeShard(user, 4)
		// Empty the home shard through other users homed there.
		for i := 0; f.counts().Shards[home].Available > 0; i++ {
			u := fmt.Sprintf("filler-%d", i)
			if stock.HomeShard(u, 4) == home {
				f.reserve(u, "r", 1)
			}
		}
		var wg sync.WaitGroup
		var got counter
		for i := range 60 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := f.e.Reserve(ctx, user, fmt.Sprintf("req-%d", i), 1+i%2)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Outcome == engine.OutcomeReserved {
					got.n.Add(int64(r.Reservation.Quantity))
					if r.Reservation.Shard == home {
						t.Errorf("reserved on the sold-out home shard")
					}
				}
				if r.Calls > 1+f.cfg.StealProbes {
					t.Errorf("%d script calls, at most %d allowed", r.Calls, 1+f.cfg.StealProbes)
				}
			}()
		}
		wg.Wait()
		held := heldByUser(t, f, user)
		if held > 3 || got.value() > 3 {
			t.Fatalf("I5 violated: user holds %d units (acknowledged %d), max 3", held, got.value())
		}
		if got.value() == 0 {
			t.Fatal("the user got nothing although other shards had stock")
		}
		f.assertConserved()
	})
}

// heldByUser counts the user's PENDING and COMMITTED units in the ledger.
func heldByUser(t *testing.T, f *fixture, user string) int64 {
	t.Helper()
	var n int64
	err := f.l.Pool().QueryRow(context.Background(),
		`SELECT coalesce(sum(quantity),0) FROM flashsale_orders WHERE campaign_id=$1 AND user_id=$2 AND status IN ('PENDING','COMMITTED')`,
		f.cfg.CampaignID, user).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestGatesClose(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(10))
		ctx := context.Background()
		for _, state := range []string{stock.StateNotStarted, stock.StatePaused, stock.StateEnded} {
			if err := f.e.SetGate(ctx, state, 0); err != nil {
				t.Fatal(err)
			}
			r := f.reserve("erin", "r-"+state, 1)
			if r.Outcome != engine.OutcomeClosed || r.Reason != state {
				t.Fatalf("gate %s: %+v", state, r)
			}
		}
		if err := f.e.SetGate(ctx, "BOGUS", 0); !errors.Is(err, stock.ErrBadState) {
			t.Fatalf("bogus gate: %v", err)
		}
		if err := f.e.SetGate(ctx, stock.StateOpen, 0); err != nil {
			t.Fatal(err)
		}
		if r := f.reserve("erin", "r-open", 1); r.Outcome != engine.OutcomeReserved {
			t.Fatalf("open: %+v", r)
		}
		// No meta at all (a Redis that lost its data) is closed too, with its own reason.
		if _, err := f.e.Store().DeleteAll(ctx); err != nil {
			t.Fatal(err)
		}
		if r := f.reserve("frank", "r", 1); r.Outcome != engine.OutcomeClosed || r.Reason != stock.ReasonNoMeta {
			t.Fatalf("no meta: %+v", r)
		}
		f.assertNoOversell()
	})
}

func TestSoldOutStealsAtMostProbes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, probes := range []int{0, 1, 2} {
			t.Run(fmt.Sprintf("probes=%d", probes), func(t *testing.T) {
				f := newFixture(t, rdb, withAllocation(0), withShards(5), withSteal(probes))
				r := f.reserve("gina", "r", 1)
				if r.Outcome != engine.OutcomeSoldOut {
					t.Fatalf("outcome %s", r.Outcome)
				}
				if r.Calls > 1+probes {
					t.Fatalf("%d script calls with stealProbes %d", r.Calls, probes)
				}
				// The claimed quota went back: the user can still reserve after a restock.
				if _, err := f.e.ApplyAllocation(context.Background(), 5); err != nil {
					t.Fatal(err)
				}
				if r := f.reserve("gina", "r2", 1); r.Outcome != engine.OutcomeReserved {
					t.Fatalf("after restock: %+v", r)
				}
				f.assertConserved()
			})
		}
	})
}

// The buyer's shard sold out and the others closed for a rebuild (or
// unverified after a failover): they may hold stock, so the answer is CLOSED,
// which clients retry, not SOLD_OUT, which they do not. The claimed quota goes
// back either way.
func TestStealingFromClosedShardsIsNotSoldOut(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(2), withShards(2), withSteal(1))
		ctx := context.Background()
		home := stock.HomeShard("iris", 2)
		for i := 0; ; i++ {
			if u := fmt.Sprintf("neighbour-%d", i); stock.HomeShard(u, 2) == home {
				if r := f.reserve(u, "r", 1); r.Outcome != engine.OutcomeReserved || r.Reservation.Shard != home {
					t.Fatalf("%s: %+v", u, r)
				}
				break
			}
		}
		if err := rdb.HSet(ctx, f.e.Store().Keys(1-home).Meta(), "state", stock.StateFailClosed).Err(); err != nil {
			t.Fatal(err)
		}
		r := f.reserve("iris", "r", 1)
		if r.Outcome != engine.OutcomeClosed || r.Reason != stock.StateFailClosed {
			t.Fatalf("home sold out, the other shard closed: %+v, want CLOSED %s", r, stock.StateFailClosed)
		}
		if err := rdb.HSet(ctx, f.e.Store().Keys(1-home).Meta(), "state", stock.StateOpen).Err(); err != nil {
			t.Fatal(err)
		}
		if r := f.reserve("iris", "r2", 1); r.Outcome != engine.OutcomeReserved {
			t.Fatalf("once the shard opened: %+v (the quota must have gone back)", r)
		}
		f.assertConserved()
	})
}

func TestReservationIDsAreServerDerived(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(10))
	a := f.reserve("henry", "k", 1)
	other, err := engine.New(func() engine.Config {
		c := withTestPipeline(f.cfg)
		c.IDSecret = []byte("another-secret-another-secret!!")
		return c
	}(), f.rdb, f.l, ledger.MaterializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if stock.ReservationKey([]byte("another-secret-another-secret!!"), f.cfg.CampaignID, "henry", "k") == strings.SplitN(a.Reservation.ID, ".", 2)[1] {
		t.Fatal("the reservation key does not depend on the secret")
	}
	shard, _, err := stock.ParseID(a.Reservation.ID, f.cfg.Shards)
	if err != nil || shard != a.Reservation.Shard {
		t.Fatalf("id %q does not encode its shard %d: %v", a.Reservation.ID, a.Reservation.Shard, err)
	}
}
