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
