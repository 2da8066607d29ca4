package salecheck

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
)

// RedisStock sums the stock counters of a sale's shards, read from the Redis
// at addr.
func RedisStock(t testing.TB, addr, uid string, shards int) int64 {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	var sum int64
	for i := range shards {
		n, err := rdb.Get(context.Background(), stock.ShardKeys(uid, i).Stock()).Int64()
		if err != nil {
			t.Fatal(err)
		}
		sum += n
	}
	return sum
}

// ReleasedOnce checks a sale whose acknowledged reservations (acked, all
// abandoned by their buyers) expired and were swept across sweepers killed
// mid-pass, once a later pass completed and rep (one buyer who reserved and
// cancelled, with --settle) settled: every unit is back, once (the audit, the
// stock read from the Redis at addr, shards of it), and every acknowledged
// reservation is CANCELLED_BY_SWEEPER in the ledger.
func ReleasedOnce(t testing.TB, q Querier, rep *storm.Report, addr, uid string, shards int, acked []string) {
	t.Helper()
	a := rep.Audit
	if a == nil || !a.OK || !a.Conserved || !a.Settled || a.Oversold != 0 {
		t.Fatalf("audit after the next pass: %+v", a)
	}
	if a.Available != a.Allocation || a.Sold != 0 || a.Reserved != 0 || a.Pending != 0 {
		t.Fatalf("after the next pass: available %d, reserved %d, sold %d, pending %d; want all %d units back", a.Available, a.Reserved, a.Sold, a.Pending, a.Allocation)
	}
	statuses := Statuses(t, q, acked)
	for _, id := range acked {
		if statuses[id] != "CANCELLED_BY_SWEEPER" {
			t.Errorf("acknowledged reservation %s is %q in the ledger, want CANCELLED_BY_SWEEPER", id, statuses[id])
		}
	}
	units := Units(t, q, uid)
	if units["CANCELLED_BY_SWEEPER"] != int64(len(acked)) || units["ABANDONED"] != 0 || units["PENDING"] != 0 {
		t.Errorf("ledger %v, want all %d acknowledged reservations CANCELLED_BY_SWEEPER", units, len(acked))
	}
	if got := RedisStock(t, addr, uid, shards); got != a.Allocation {
		t.Errorf("Redis stock %d, want %d: a unit was released twice or never", got, a.Allocation)
	}
}
