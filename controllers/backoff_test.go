package controllers

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// Rebuilds failing in a row for a lasting reason wait 3 s, 6 s, ... at
// most a minute; a new generation of the spec, or the wait's end, lets the
// next one start.
func TestRebuildBackoff(t *testing.T) {
	var b rebuildBackoff
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	if d, err := b.wait(1, now); err != nil || d != 0 {
		t.Fatalf("before any failure: %s %v", d, err)
	}
	drift := fmt.Errorf("%w: shard 0", engine.ErrCountsDrift)
	var got []time.Duration
	for range 8 {
		got = append(got, b.failedAgain(drift, 1, now))
	}
	want := []time.Duration{3 * time.Second, 6 * time.Second, 12 * time.Second, 24 * time.Second, 48 * time.Second, time.Minute, time.Minute, time.Minute}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits %v, want %v", got, want)
		}
	}
	if d, err := b.wait(1, now.Add(59*time.Second)); err != drift || d != time.Second {
		t.Fatalf("a second before the next try: %s %v", d, err)
	}
	if d, err := b.wait(1, now.Add(time.Minute)); err != nil || d != 0 {
		t.Fatalf("at the next try: %s %v", d, err)
	}
	if d, err := b.wait(2, now); err != nil || d != 0 {
		t.Fatalf("with a new generation: %s %v", d, err)
	}
	// An outage is tried again after 3 s, and starts the count over.
	if d := b.failedAgain(errors.New("ledger unreachable"), 1, now); d != 3*time.Second || b.n != 0 {
		t.Fatalf("an outage after lasting failures: wait %s, count %d", d, b.n)
	}
	if d := b.failedAgain(drift, 1, now); d != 3*time.Second {
		t.Fatalf("drift after an outage: wait %s, want 3s", d)
	}
}

// A rebuild stopped while it runs (its connections replaced) was
// interrupted, not failed; one that had already failed on its own when it
// was stopped keeps its failure, which is reported and backs off.
func TestAStoppedRebuildIsInterruptedOnlyIfItWasRunning(t *testing.T) {
	running := &rebuildRun{done: make(chan struct{})}
	running.cancel = func() { running.err = fmt.Errorf("rebuild: shard 0: %w", context.Canceled); close(running.done) }
	running.stop()
	if !running.interrupted() {
		t.Fatal("a running rebuild stopped: not interrupted")
	}
	failed := &rebuildRun{done: make(chan struct{}), err: engine.ErrCountsDrift}
	close(failed.done)
	failed.cancel = func() {}
	failed.stop()
	if failed.interrupted() {
		t.Fatal("a rebuild that failed before it was stopped taken for interrupted")
	}
}
