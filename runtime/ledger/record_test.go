package ledger

import (
	"errors"
	"maps"
	"testing"
	"time"
)

// The record outlives the process that wrote it: a new ledger connection (an
// operator restarted) reads the servers and the last rebuild back.
func TestCampaignRecord(t *testing.T) {
	t.Parallel()
	dsn := newDSN(t, testPG)
	l := openLedger(t, dsn)
	ctx := testCtx(t)
	if _, err := l.GetRecord(ctx, "uid-none"); !errors.Is(err, ErrCampaignNotFound) {
		t.Fatalf("record of no campaign: %v", err)
	}
	if err := l.RecordRebuild(ctx, "uid-none", RebuildRecord{Epoch: 2}, map[string]string{"a:1": "r"}); !errors.Is(err, ErrCampaignNotFound) {
		t.Fatalf("rebuild of no campaign: %v", err)
	}
	if err := l.RecordFailClosed(ctx, "uid-none", FailClosedRecord{Epoch: 1}); !errors.Is(err, ErrCampaignNotFound) {
		t.Fatalf("fail-closed of no campaign: %v", err)
	}
	if _, _, err := l.EnsureCampaign(ctx, Campaign{ID: "uid-rec", Namespace: "shop", Name: "drop", SKU: "sku", Allocation: 10, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	rec, err := l.GetRecord(ctx, "uid-rec")
	if err != nil || rec.Servers != nil || rec.LastRebuild != nil {
		t.Fatalf("new campaign's record: %+v %v", rec, err)
	}
	// Bad input changes nothing.
	if err := l.RecordServers(ctx, "uid-rec", nil); err == nil {
		t.Fatal("no servers recorded without an error")
	}
	servers := map[string]string{"127.0.0.1:6379": "run-a", "127.0.0.1:6380": "run-b"}
	if err := l.RecordServers(ctx, "uid-rec", servers); err != nil {
		t.Fatal(err)
	}
	// Recording the same servers again writes nothing (and succeeds).
	if err := l.RecordServers(ctx, "uid-rec", servers); err != nil {
		t.Fatal(err)
	}
	if rec.RebuildDue() {
		t.Fatal("a rebuild due on a new campaign")
	}
	if err := l.RecordFailClosed(ctx, "uid-rec", FailClosedRecord{Time: time.Now().UTC().Truncate(time.Microsecond), Reason: "shard 0 has no meta", Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	if rec, err = l.GetRecord(ctx, "uid-rec"); err != nil || !rec.RebuildDue() {
		t.Fatalf("failed closed at epoch 1, no rebuild since: due %v, %+v %v", rec.RebuildDue(), rec.FailClosed, err)
	}
	rb := RebuildRecord{Time: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC), Reason: "shard 0 has no meta", Epoch: 2,
		Available: 4, Reserved: 3, Sold: 3, Restored: 2, Duration: 1500 * time.Millisecond}
	restarted := map[string]string{"127.0.0.1:6379": "run-c", "127.0.0.1:6380": "run-b"}
	if err := l.RecordRebuild(ctx, "uid-rec", rb, restarted); err != nil {
		t.Fatal(err)
	}
	l = openLedger(t, dsn) // another process's connection
	rec, err = l.GetRecord(ctx, "uid-rec")
	if err != nil || !maps.Equal(rec.Servers, restarted) || rec.LastRebuild == nil || *rec.LastRebuild != rb {
		t.Fatalf("record read back: %+v %+v %v", rec, rec.LastRebuild, err)
	}
	if rec.RebuildDue() {
		t.Fatalf("rebuilt at epoch 2 after failing closed at epoch 1, still due: %+v", rec.FailClosed)
	}
	// Failed closed again at the rebuilt epoch: due again.
	if err := l.RecordFailClosed(ctx, "uid-rec", FailClosedRecord{Reason: "epoch", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if rec, err = l.GetRecord(ctx, "uid-rec"); err != nil || !rec.RebuildDue() {
		t.Fatalf("failed closed at epoch 2 after the rebuild at 2: due %v %v", rec.RebuildDue(), err)
	}
}

// A rebuild's start is recorded with its epoch; bad input changes nothing.
func TestRebuildStartRecord(t *testing.T) {
	t.Parallel()
	l := openLedger(t, newDSN(t, testPG))
	ctx := testCtx(t)
	if err := l.RecordRebuildStart(ctx, "uid-none", RebuildStart{Epoch: 1}); !errors.Is(err, ErrCampaignNotFound) {
		t.Fatalf("rebuild start of no campaign: %v", err)
	}
	if _, _, err := l.EnsureCampaign(ctx, Campaign{ID: "uid-start", Namespace: "shop", Name: "drop", SKU: "sku", Allocation: 10, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	if rec, err := l.GetRecord(ctx, "uid-start"); err != nil || rec.RebuildStarted != nil {
		t.Fatalf("new campaign's rebuild start: %+v %v", rec.RebuildStarted, err)
	}
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for _, rs := range []RebuildStart{{Time: at, Epoch: 2}, {Time: at.Add(time.Second), Epoch: 3}} {
		if err := l.RecordRebuildStart(ctx, "uid-start", rs); err != nil {
			t.Fatal(err)
		}
		if rec, err := l.GetRecord(ctx, "uid-start"); err != nil || rec.RebuildStarted == nil || *rec.RebuildStarted != rs {
			t.Fatalf("rebuild start read back: %+v %v, want %+v", rec.RebuildStarted, err, rs)
		}
	}
	for _, bad := range []int64{0, -1} {
		if err := l.RecordRebuildStart(ctx, "uid-start", RebuildStart{Time: at, Epoch: bad}); err == nil {
			t.Fatalf("a rebuild start at epoch %d recorded without an error", bad)
		}
	}
	if rec, err := l.GetRecord(ctx, "uid-start"); err != nil || rec.RebuildStarted.Epoch != 3 {
		t.Fatalf("after a refused start: %+v %v", rec.RebuildStarted, err)
	}
}
