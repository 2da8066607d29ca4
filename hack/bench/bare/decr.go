package main

import (
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// decrScript is the one-command reference: the cheapest script call that
// still takes a unit. It runs on a counter of its own beside the shard's keys
// (seeded by the benchmark), never on the product's stock.
//
// KEYS[1] the counter. Returns the units left after the decrement.
//
// Run twice: NOT safe (two units taken); never re-sent (the benchmark's
// client has MaxRetries -1, as the product's).
var decrScript = redis.NewScript(`return redis.call('DECR', KEYS[1])`)

// DecrKey is the counter the decr backend decrements on a shard.
func decrKey(k stock.Keys) string { return k.Stock() + ":decr" }

type decrHandler struct {
	rdb      redis.UniversalClient
	campaign string
	shards   int
	keys     *stock.Keyer
}

func (h *decrHandler) reserve(w http.ResponseWriter, r *http.Request) {
	in, ok := decode(w, r)
	if !ok {
		return
	}
	// The same per-request work as the script backend: the derived key and the
	// home shard.
	key := h.keys.Key(h.campaign, in.UserID, in.IdempotencyKey)
	home := stock.HomeShard(in.UserID, h.shards)
	left, err := decrScript.Run(r.Context(), h.rdb, []string{decrKey(stock.ShardKeys(h.campaign, home))}).Int64()
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "CLOSED", err.Error())
		return
	}
	if left < 0 {
		soldOut(w)
		return
	}
	reserved(w, false, stock.FormatID(home, key), time.Now().Add(10*time.Minute))
}
