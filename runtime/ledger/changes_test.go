package ledger

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

func sum(xs []int64) (s int64) {
	for _, x := range xs {
		s += x
	}
	return s
}

func TestPlanAllocationIncrease(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 10, 3) // shards 4, 3, 3

	ch, ok, err := l.PlanAllocationIncrease(ctx, c.ID, 12)
	if err != nil || !ok {
		t.Fatalf("plan 12: %v %v", ok, err)
	}
	if ch.FromAllocation != 10 || ch.ToAllocation != 12 || !slices.Equal(ch.ShardDeltas, []int64{0, 1, 1}) || ch.AppliedAt != nil || ch.ID == 0 {
		t.Errorf("change %+v", ch)
	}
	got, _ := l.GetCampaign(ctx, c.ID)
	if got.Allocation != 12 || got.LastChangeID != ch.ID || !slices.Equal(got.ShardAllocations, []int64{4, 4, 4}) || got.Epoch != 1 {
		t.Errorf("campaign after plan %+v", got)
	}

	// Exactly once: the same target again changes nothing.
	if again, ok, err := l.PlanAllocationIncrease(ctx, c.ID, 12); err != nil || ok || again.ID != 0 {
		t.Errorf("plan 12 again: %+v %v %v", again, ok, err)
	}
	if _, _, err := l.PlanAllocationIncrease(ctx, c.ID, 11); !errors.Is(err, ErrAllocationDecrease) {
		t.Errorf("decrease: %v", err)
	}
	if _, _, err := l.PlanAllocationIncrease(ctx, "no-such-campaign", 11); !errors.Is(err, ErrCampaignNotFound) {
		t.Errorf("unknown campaign: %v", err)
	}

	// Successive restocks keep the shards as even as a fresh split.
	for _, target := range []int64{20, 23, 23, 31} {
		if _, _, err := l.PlanAllocationIncrease(ctx, c.ID, target); err != nil {
			t.Fatal(err)
		}
		got, _ := l.GetCampaign(ctx, c.ID)
		if !slices.Equal(got.ShardAllocations, SplitAllocation(target, 3)) || got.Allocation != target {
			t.Errorf("after restock to %d: %+v", target, got)
		}
	}

	_, pending, err := l.UnappliedChanges(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 4 || pending[0].ID != ch.ID {
		t.Fatalf("unapplied %+v", pending)
	}
	var total int64
	for i, p := range pending {
		if i > 0 && (p.ID <= pending[i-1].ID || p.FromAllocation != pending[i-1].ToAllocation) {
			t.Errorf("changes out of order: %+v", pending)
		}
		if sum(p.ShardDeltas) != p.ToAllocation-p.FromAllocation {
			t.Errorf("change %d: deltas %v do not sum to %d", p.ID, p.ShardDeltas, p.ToAllocation-p.FromAllocation)
		}
		total += sum(p.ShardDeltas)
	}
	if total != 31-10 {
		t.Errorf("deltas add up to %d, want 21", total)
	}

	if err := l.MarkChangeApplied(ctx, ch.ID); err != nil {
		t.Fatal(err)
	}
	if err := l.MarkChangeApplied(ctx, ch.ID); err != nil { // repeatable
		t.Fatal(err)
	}
	if _, pending, _ := l.UnappliedChanges(ctx, c.ID); len(pending) != 3 || pending[0].ID == ch.ID {
		t.Errorf("unapplied after marking %d: %+v", ch.ID, pending)
	}
	if err := l.MarkChangeApplied(ctx, 1<<40); !errors.Is(err, ErrNotFound) {
		t.Errorf("mark unknown change: %v", err)
	}
}

// Ten controllers asking for the same restock at once plan it once.
func TestPlanAllocationIncreaseConcurrent(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	c := newCampaign(t, l, 1000, 10)
	var planned atomic.Int32
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			_, ok, err := l.PlanAllocationIncrease(testCtx(t), c.ID, 1234)
			if err != nil {
				t.Error(err)
			}
			if ok {
				planned.Add(1)
			}
		})
	}
	wg.Wait()
	if planned.Load() != 1 {
		t.Fatalf("planned %d times", planned.Load())
	}
	got, _ := l.GetCampaign(testCtx(t), c.ID)
	if got.Allocation != 1234 || sum(got.ShardAllocations) != 1234 {
		t.Fatalf("campaign %+v", got)
	}
	_, pending, _ := l.UnappliedChanges(testCtx(t), c.ID)
	if len(pending) != 1 || sum(pending[0].ShardDeltas) != 234 {
		t.Fatalf("changes %+v", pending)
	}
}

// WithAllocationSettled calls its function only while the allocation is the
// one read and every change is applied, and waits for a transaction that
// holds the campaign's row (a decrease still committing) before it looks.
func TestWithAllocationSettled(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 10, 2)
	calls := 0
	call := func() error { calls++; return nil }

	if err := l.WithAllocationSettled(ctx, c.ID, 10, call); err != nil || calls != 1 {
		t.Fatalf("settled at 10: %v, %d calls", err, calls)
	}
	if err := l.WithAllocationSettled(ctx, c.ID, 12, call); !errors.Is(err, ErrAllocationMoved) || calls != 1 {
		t.Fatalf("read as 12, the ledger's 10: %v, %d calls", err, calls)
	}
	if _, _, err := l.PlanAllocationIncrease(ctx, c.ID, 12); err != nil {
		t.Fatal(err)
	}
	if err := l.WithAllocationSettled(ctx, c.ID, 12, call); !errors.Is(err, ErrAllocationMoved) || calls != 1 {
		t.Fatalf("with the change to 12 not applied: %v, %d calls", err, calls)
	}
	if err := l.WithAllocationSettled(ctx, "no-such-campaign", 12, call); !errors.Is(err, ErrCampaignNotFound) || calls != 1 {
		t.Fatalf("unknown campaign: %v, %d calls", err, calls)
	}
	fnErr := errors.New("redis said no")
	_, changes, err := l.UnappliedChanges(ctx, c.ID)
	if err != nil || len(changes) != 1 || l.MarkChangeApplied(ctx, changes[0].ID) != nil {
		t.Fatalf("changes %+v %v", changes, err)
	}
	if err := l.WithAllocationSettled(ctx, c.ID, 12, func() error { return fnErr }); err != fnErr {
		t.Fatalf("the function's own error: %v", err)
	}

	// A decrease to 8 holds the row, as one whose COMMIT waits does: the
	// call waits, then sees 8, and does not call its function.
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE`, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE flashsale_campaigns SET allocation = 8 WHERE campaign_id = $1`, c.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var called atomic.Bool
	go func() {
		done <- l.WithAllocationSettled(ctx, c.ID, 12, func() error { called.Store(true); return nil })
	}()
	testharness.WaitForLockWaiters(t, l.pool.Config().ConnString(), 1, 30*time.Second, "the call to wait for the held row")
	select {
	case err := <-done:
		t.Fatalf("answered while the row was held: %v", err)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrAllocationMoved) || called.Load() {
		t.Fatalf("after the decrease to 8 committed: %v, called %v", err, called.Load())
	}
}
