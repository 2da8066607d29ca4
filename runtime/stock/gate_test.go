package stock

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// CloseOpen closes the open shards only: a shard failed closed keeps its
// state (it says the shard waits for a rebuild), and an absent one is left
// absent.
func TestCloseOpenLeavesOtherStates(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := New(rdb, "c-close-open", 3)
	for shard, state := range []string{StateOpen, StateFailClosed} {
		if _, err := s.Seed(ctx, shard, 10, 1, state, 0); err != nil {
			t.Fatal(err)
		}
	}
	out, err := s.CloseOpen(ctx, StatePaused)
	if err != nil {
		t.Fatal(err)
	}
	if out[0] != GateSet || out[1] != GateSet || out[2] != GateNoMeta {
		t.Fatalf("outcomes %v", out)
	}
	states, err := s.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if states[0].State != StatePaused || states[1].State != StateFailClosed || states[2].Present {
		t.Fatalf("states after CloseOpen: %+v", states)
	}
	if _, err := s.CloseOpen(ctx, StateOpen); err == nil {
		t.Fatal("CloseOpen opened")
	}
}

// A shard failed closed opens only through the rebuild that finished it
// (SetGateRebuilt at that rebuild's epoch): a gate written by anyone else (the
// operator's reconcile, which found the shards live a moment before they
// failed closed) leaves it closed and says so, whatever state it asks for,
// and so does the rebuild's own gate once the shard failed closed again
// after its finish (another loss). Failing closed again is a no-op.
func TestOnlyTheRebuildOpensAShardFailedClosed(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := New(rdb, "c-failed-closed", 2)
	for shard, state := range []string{StateOpen, StateFailClosed} {
		if _, err := s.Seed(ctx, shard, 10, 1, state, 0); err != nil {
			t.Fatal(err)
		}
	}
	stateOf := func(shard int) string {
		t.Helper()
		st, err := s.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st[shard].State
	}
	for _, gate := range []string{StateOpen, StatePaused, StateNotStarted, StateEnded} {
		out, err := s.SetGate(ctx, gate, 1)
		if err != nil {
			t.Fatal(err)
		}
		if out[0] != GateSet || out[1] != GateFailedClosed || stateOf(1) != StateFailClosed {
			t.Fatalf("SetGate %s: outcomes %v, shard 1 %s; want the failed shard left closed (%d)", gate, out, stateOf(1), GateFailedClosed)
		}
	}
	if out, err := s.SetGate(ctx, StateFailClosed, 0); err != nil || out[1] != GateSet {
		t.Fatalf("failing closed again: %v %v", out, err)
	}
	if out, err := s.SetGateRebuilt(ctx, StateOpen, 1); err != nil || out[1] != GateFailedClosed {
		t.Fatalf("a rebuild's gate on shards it did not finish: %v %v, want them left closed", out, err)
	}
	rebuild := func(epoch int64) {
		t.Helper()
		for shard := range 2 {
			if err := s.RebuildBegin(ctx, shard, epoch); err != nil {
				t.Fatal(err)
			}
			if err := s.RebuildFinish(ctx, shard, 10, epoch, StateFailClosed, 10, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	rebuild(2)
	if _, err := s.SetGate(ctx, StateFailClosed, 0); err != nil { // another loss, before the rebuild's gate
		t.Fatal(err)
	}
	if out, err := s.SetGateRebuilt(ctx, StateOpen, 2); err != nil || out[0] != GateFailedClosed || out[1] != GateFailedClosed {
		t.Fatalf("the rebuild's gate after a fail close since its finish: %v %v, want the shards left closed", out, err)
	}
	rebuild(3)
	if out, err := s.SetGateRebuilt(ctx, StateOpen, 3); err != nil || out[0] != GateSet || out[1] != GateSet || stateOf(1) != StateOpen {
		t.Fatalf("the rebuild's gate: %v %v, shard 1 %s; want it open", out, err, stateOf(1))
	}
}
