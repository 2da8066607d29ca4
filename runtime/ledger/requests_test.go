package ledger

import (
	"errors"
	"testing"
	"time"
)

// I4 in the ledger: one row per request (its key, the id after the shard)
// in a campaign, whatever the shard and the status, and written by either
// writer (the materializer, an abandonment).
func TestOneRowPerRequest(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 4)
	m := l.NewMaterializer(MaterializerConfig{})
	defer m.Close()
	on := func(c Campaign, shard int, key string) Order {
		o := pendingOrder(c, "u", shard, time.Hour)
		o.ReservationID = string(rune('0'+shard)) + "." + key
		return o
	}

	first := on(c, 0, uniqueID("k"))
	if err := m.Submit(ctx, first); err != nil {
		t.Fatal(err)
	}
	key := first.ReservationID[2:]
	if err := m.Submit(ctx, on(c, 1, key)); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("the same request on another shard: %v, want ErrDuplicate", err)
	}
	// Cancelled, the request still owns its key.
	if out, _, err := l.CancelByUser(ctx, c.ID, first.ReservationID, "u"); err != nil || out != CancelCancelled {
		t.Fatalf("cancel: %v %v", out, err)
	}
	if err := m.Submit(ctx, on(c, 2, key)); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("the cancelled request on another shard: %v, want ErrDuplicate", err)
	}
	got, wrote, err := l.RecordAbandoned(ctx, []Order{{ReservationID: "3." + key, CampaignID: c.ID, SKU: c.SKU, UserID: "u",
		Shard: 3, Quantity: 1, Epoch: c.Epoch, ExpiresAt: time.Now()}})
	if err != nil || wrote != 0 {
		t.Fatalf("%d rows written (%v), want none", wrote, err)
	}
	if s, ok := got["3."+key]; ok {
		t.Fatalf("an abandonment of the request on another shard was recorded: %s", s)
	}
	o, err := l.GetRequestOrder(ctx, c.ID, key)
	if err != nil || o.ReservationID != first.ReservationID || o.Status != StatusCancelledByUser {
		t.Fatalf("request lookup: %+v %v", o, err)
	}
	if _, err := l.GetRequestOrder(ctx, c.ID, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown request: %v", err)
	}
	// Another campaign's request key is its own.
	other := newCampaign(t, l, 100, 4)
	if err := m.Submit(ctx, on(other, 1, key)); err != nil {
		t.Fatalf("the same key in another campaign: %v", err)
	}

	// Two placements of one request in one batch: one row.
	for range 10 {
		k := uniqueID("k")
		var ok, dup int
		for _, err := range submitAll(ctx, m, []Order{on(c, 0, k), on(c, 1, k), on(c, 2, k)}) {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, ErrDuplicate):
				dup++
			default:
				t.Fatal(err)
			}
		}
		if ok != 1 || dup != 2 {
			t.Fatalf("one request on three shards at once: %d written, %d duplicates", ok, dup)
		}
	}
}
