package stock_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A paused or ended sale takes nothing, but answers a retry of a request it
// placed as a replay: that reservation is held and checkout takes it, so the
// buyer must not be told the sale is closed to them. A sale failed closed
// answers closed even to a retry (its data may not be the ledger's).
func TestAPausedOrEndedSaleReplaysARequestItPlaced(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := stock.New(rdb, "closed-replay", 1)
	if err := seed(5)(ctx, s); err != nil {
		t.Fatal(err)
	}
	placed, err := s.Reserve(ctx, req(stock.ModeHome))
	if err != nil || placed.Code != stock.Reserved {
		t.Fatalf("reserve: %+v %v", placed, err)
	}
	another := req(stock.ModeHome)
	another.User, another.Key = "other", "req-2"
	for _, gate := range []string{stock.StatePaused, stock.StateEnded, stock.StateFailClosed} {
		if _, err := s.SetGate(ctx, gate, 0); err != nil {
			t.Fatal(err)
		}
		retry, err := s.Reserve(ctx, req(stock.ModeHome))
		if err != nil {
			t.Fatal(err)
		}
		if gate == stock.StateFailClosed {
			if retry.Code != stock.Closed || retry.Status != gate {
				t.Fatalf("a retry while %s: %+v; want closed", gate, retry)
			}
		} else if retry.Code != stock.Replay || retry.ExpiryMs != placed.ExpiryMs {
			t.Fatalf("a retry while %s: %+v; want the replay of %+v", gate, retry, placed)
		}
		if got, err := s.Reserve(ctx, another); err != nil || got.Code != stock.Closed || got.Status != gate {
			t.Fatalf("a new request while %s: %+v %v; want closed %s", gate, got, err, gate)
		}
	}
	if st, err := s.State(ctx); err != nil || st[0].Available != 4 || st[0].Reserved != 1 {
		t.Fatalf("state: %+v %v; want 4 available and 1 reserved", st, err)
	}
}
