package ledger

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// readRebuild streams a rebuild's snapshot into memory, batch rows at a time.
func readRebuild(t testing.TB, l *Ledger, c Campaign, batch int) ([]Order, map[string]int64, []ShardCounts) {
	t.Helper()
	var orders []Order
	holders := map[string]int64{}
	counts, err := l.ReadRebuild(testCtx(t), c.ID, c.Shards, RebuildReader{
		Batch: batch,
		Pending: func(_ context.Context, os []Order) error {
			if len(os) > batch {
				t.Errorf("a batch of %d orders, asked for %d", len(os), batch)
			}
			orders = append(orders, os...)
			return nil
		},
		Holders: func(_ context.Context, hs []Holder) error {
			for _, h := range hs {
				if _, dup := holders[h.UserID]; dup {
					t.Errorf("holder %s streamed twice", h.UserID)
				}
				holders[h.UserID] += h.Units
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return orders, holders, counts
}

func TestBeginRebuild(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 30, 3)
	const grace = 10 * time.Minute
	add := func(shard int, st Status, expiresIn time.Duration) Order {
		o := pendingOrder(c, "u", shard, 0)
		o.Status = st
		if st == StatusCommitted {
			o.PaymentToken = "pay"
		}
		return insertOrder(t, l, o, expiresIn)
	}
	committed := add(0, StatusCommitted, -time.Hour) // paid: expiry no longer matters
	valid := add(1, StatusPending, time.Hour)
	inGrace := add(2, StatusPending, -time.Minute)
	expired := add(2, StatusPending, -time.Hour)
	add(1, StatusCancelledByUser, time.Hour)
	add(1, StatusAbandoned, -time.Hour)

	snap, err := l.BeginRebuild(ctx, c.ID, grace)
	if err != nil {
		t.Fatal(err)
	}
	if snap.PreviousEpoch != 1 || snap.Campaign.Epoch != 2 {
		t.Errorf("epochs: previous %d, new %d", snap.PreviousEpoch, snap.Campaign.Epoch)
	}
	if !slices.Equal(snap.Campaign.ShardAllocations, []int64{10, 10, 10}) {
		t.Errorf("shard allocations %v", snap.Campaign.ShardAllocations)
	}
	if snap.Expired != 1 {
		t.Errorf("expired %d, want 1", snap.Expired)
	}
	mustStatus(t, l, expired.ReservationID, StatusCancelledBySweeper)
	orders, holders, counts := readRebuild(t, l, snap.Campaign, 1)
	var ids []string
	for _, o := range orders {
		ids = append(ids, o.ReservationID)
	}
	want := []string{valid.ReservationID, inGrace.ReservationID} // pending only, by shard
	if !slices.Equal(ids, want) {
		t.Errorf("snapshot orders %v, want %v", ids, want)
	}
	if want := []ShardCounts{{Committed: 1}, {Pending: 1}, {Pending: 1}}; !slices.Equal(counts, want) {
		t.Errorf("snapshot counts %v, want %v (committed %s counted, not streamed)", counts, want, committed.ReservationID)
	}
	if holders["u"] != 3 || len(holders) != 1 {
		t.Errorf("holders %v, want u: 3 (committed and pending)", holders)
	}
	stored, _ := l.GetCampaign(ctx, c.ID)
	if stored.Epoch != 2 {
		t.Errorf("stored epoch %d", stored.Epoch)
	}

	again, err := l.BeginRebuild(ctx, c.ID, grace)
	if err != nil || again.PreviousEpoch != 2 || again.Campaign.Epoch != 3 || again.Expired != 0 {
		t.Errorf("second rebuild: %+v %v", again, err)
	}

	if _, err := l.BeginRebuild(ctx, "no-such-campaign", grace); !errors.Is(err, ErrCampaignNotFound) {
		t.Errorf("rebuild of unknown campaign: %v", err)
	}
	if err := l.MarkCampaignDeleted(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := l.BeginRebuild(ctx, c.ID, grace); !errors.Is(err, ErrCampaignNotFound) {
		t.Errorf("rebuild of deleted campaign: %v", err)
	}
}

// A rebuild writes stock from the shard allocations, which already include
// every planned change: those changes must not be applied to Redis again.
func TestBeginRebuildAbsorbsPlannedChanges(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 10, 3)
	if _, ok, err := l.PlanAllocationIncrease(ctx, c.ID, 15); err != nil || !ok {
		t.Fatalf("plan: %v %v", ok, err)
	}
	snap, err := l.BeginRebuild(ctx, c.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(snap.Campaign.ShardAllocations, []int64{5, 5, 5}) || snap.Campaign.Allocation != 15 {
		t.Errorf("snapshot campaign %+v", snap.Campaign)
	}
	if _, pending, err := l.UnappliedChanges(ctx, c.ID); err != nil || len(pending) != 0 {
		t.Errorf("unapplied after rebuild: %v %v", pending, err)
	}
	// A change planned after the rebuild is Redis's to apply.
	ch, ok, err := l.PlanAllocationIncrease(ctx, c.ID, 16)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	epoch, pending, _ := l.UnappliedChanges(ctx, c.ID)
	if len(pending) != 1 || pending[0].ID != ch.ID {
		t.Errorf("unapplied %v, want change %d", pending, ch.ID)
	}
	// It is applied under the epoch read with it: the rebuild's.
	if epoch != snap.Campaign.Epoch {
		t.Errorf("unapplied changes read with epoch %d, rebuild's is %d", epoch, snap.Campaign.Epoch)
	}
	if _, _, err := l.UnappliedChanges(ctx, "no-such-campaign"); !errors.Is(err, ErrCampaignNotFound) {
		t.Errorf("unapplied changes of an unknown campaign: %v", err)
	}
}

// A rebuild's cancel of the expired rows and a sweeper's cancel of the same
// rows lock them in one order: whatever plan each statement gets (a table
// scan in insertion order, an index scan in id order), and while a third
// transaction (a checkout, a user's cancel) holds one row, neither fails
// with a deadlock.
func TestRebuildAndSweeperCancelInOneLockOrder(t *testing.T) {
	dsn := newDSN(t, testPG)
	sweeper := openLedger(t, dsn)
	// The sweeper's plan walks the live index (shard order: A on shard 0
	// first), the rebuild's scans the table (insertion order: B first).
	l := openLedger(t, dsn+"&options=-c%20enable_indexscan%3Doff%20-c%20enable_bitmapscan%3Doff")
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	b, a := pendingOrder(c, "u", 1, 0), pendingOrder(c, "u", 0, 0)
	b.ReservationID, a.ReservationID = "1.b-"+b.ReservationID, "0.a-"+a.ReservationID
	insertOrder(t, l, b, -time.Minute)
	insertOrder(t, l, a, -time.Minute)

	blocker := holdLock(t, l, sqlTestLockOrder, a.ReservationID)
	sweep := make(chan error, 1)
	go func() {
		_, err := sweeper.CancelExpired(ctx, c.ID, []string{b.ReservationID, a.ReservationID}, 0)
		sweep <- err
	}()
	testharness.WaitForLockWaiters(t, dsn, 1, 30*time.Second, "the sweeper to wait for A")
	rebuild := make(chan error, 1)
	go func() {
		_, err := l.BeginRebuild(ctx, c.ID, 0)
		rebuild <- err
	}()
	testharness.WaitForLockWaiters(t, dsn, 2, 30*time.Second, "the rebuild to wait too")
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-sweep; err != nil {
		t.Fatalf("sweeper: %v", err)
	}
	if err := <-rebuild; err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	for _, o := range []Order{a, b} {
		if got, err := l.GetOrder(ctx, o.CampaignID, o.ReservationID); err != nil || got.Status != StatusCancelledBySweeper {
			t.Fatalf("%s: %+v %v", o.ReservationID, got.Status, err)
		}
	}
}

// A rebuild's start outlives a statement_timeout the database or role sets:
// its cancel of the expired orders waits here for a row lock past it (as it
// may scan millions of pending orders past it), and failing would fail
// every retry, the sale closed all along.
func TestBeginRebuildOutlivesAStatementTimeout(t *testing.T) {
	t.Parallel()
	l := openLedger(t, newDSN(t, testPG)+"&statement_timeout=200")
	ctx := testCtx(t)
	c := newCampaign(t, l, 10, 1)
	expired := insertOrder(t, l, pendingOrder(c, "u", 0, 0), -time.Hour)
	tx, err := l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM flashsale_orders WHERE reservation_id = $1 FOR UPDATE", expired.ReservationID); err != nil {
		t.Fatal(err)
	}
	// Released well past the statement timeout: the rebuild waits for it.
	released := time.AfterFunc(time.Second, func() { _ = tx.Rollback(context.Background()) })
	defer func() {
		if released.Stop() {
			_ = tx.Rollback(context.Background())
		}
	}()
	snap, err := l.BeginRebuild(ctx, c.ID, 0)
	if err != nil {
		t.Fatalf("a rebuild's start that waited past the statement timeout: %v", err)
	}
	if snap.Expired != 1 {
		t.Fatalf("expired %d, want 1", snap.Expired)
	}
	mustStatus(t, l, expired.ReservationID, StatusCancelledBySweeper)
}
