package ledger

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestEnsureCampaignIdempotent(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	want := Campaign{ID: "uid-1", Namespace: "shop", Name: "ps5-drop", SKU: "itm-ps5-pro", Allocation: 1003, Shards: 10}
	c, created, err := l.EnsureCampaign(ctx, want)
	if err != nil || !created {
		t.Fatalf("first EnsureCampaign: created=%v err=%v", created, err)
	}
	if c.Epoch != 1 || c.Allocation != 1003 || c.Shards != 10 || c.SKU != "itm-ps5-pro" || c.LastChangeID != 0 || c.DeletedAt != nil {
		t.Fatalf("stored campaign: %+v", c)
	}
	if !slices.Equal(c.ShardAllocations, SplitAllocation(1003, 10)) {
		t.Fatalf("shard allocations %v", c.ShardAllocations)
	}

	// Never changes an existing row.
	changed := want
	changed.Allocation, changed.Shards = 5, 2
	again, created, err := l.EnsureCampaign(ctx, changed)
	if err != nil || created {
		t.Fatalf("second EnsureCampaign: created=%v err=%v", created, err)
	}
	if again.Allocation != 1003 || again.Shards != 10 || len(again.ShardAllocations) != 10 || again.Epoch != 1 {
		t.Fatalf("existing campaign changed: %+v", again)
	}

	got, err := l.GetCampaign(ctx, "uid-1")
	if err != nil || !slices.Equal(got.ShardAllocations, c.ShardAllocations) {
		t.Fatalf("GetCampaign: %+v %v", got, err)
	}
	if _, err := l.GetCampaign(ctx, "nope"); !errors.Is(err, ErrCampaignNotFound) {
		t.Fatalf("GetCampaign(unknown): %v", err)
	}
}

func TestEnsureCampaignConcurrent(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	var created atomic.Int32
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			_, ok, err := l.EnsureCampaign(testCtx(t), Campaign{ID: "uid-c", Namespace: "n", Name: "x", SKU: "s", Allocation: 10, Shards: 3})
			if err != nil {
				t.Error(err)
			}
			if ok {
				created.Add(1)
			}
		})
	}
	wg.Wait()
	if created.Load() != 1 {
		t.Fatalf("created %d times", created.Load())
	}
	c, err := l.GetCampaign(testCtx(t), "uid-c")
	if err != nil || !slices.Equal(c.ShardAllocations, []int64{4, 3, 3}) {
		t.Fatalf("campaign %+v %v", c, err)
	}
}

func TestEnsureCampaignValidates(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	for _, c := range []Campaign{
		{ID: "", Shards: 1},
		{ID: "a", Shards: 0},
		{ID: "b", Shards: 1, Allocation: -1},
	} {
		if _, _, err := l.EnsureCampaign(testCtx(t), c); err == nil {
			t.Errorf("EnsureCampaign(%+v) accepted", c)
		}
	}
}

func TestMarkCampaignDeleted(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 10, 2)
	o := pendingOrder(c, "u1", 0, time.Hour)
	m := l.NewMaterializer(MaterializerConfig{})
	defer m.Close()
	if err := m.Submit(ctx, o); err != nil {
		t.Fatal(err)
	}
	if err := l.MarkCampaignDeleted(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	first, err := l.GetCampaign(ctx, c.ID)
	if err != nil || first.DeletedAt == nil {
		t.Fatalf("after delete: %+v %v", first, err)
	}
	if err := l.MarkCampaignDeleted(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	second, _ := l.GetCampaign(ctx, c.ID)
	if !second.DeletedAt.Equal(*first.DeletedAt) {
		t.Errorf("deleted_at moved from %v to %v", first.DeletedAt, second.DeletedAt)
	}
	if _, err := l.GetOrder(ctx, o.CampaignID, o.ReservationID); err != nil {
		t.Errorf("order lost with its campaign: %v", err)
	}
	if err := m.Submit(ctx, pendingOrder(c, "u2", 1, time.Hour)); !errors.Is(err, ErrFenced) {
		t.Errorf("Submit to deleted campaign: %v, want ErrFenced", err)
	}
	if err := l.MarkCampaignDeleted(ctx, "nope"); !errors.Is(err, ErrCampaignNotFound) {
		t.Errorf("delete unknown: %v", err)
	}
}
