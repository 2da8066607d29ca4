package ledger

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/uuid"
)

// BenchmarkMaterializerPostgresCPU prices the ledger's writes in PostgreSQL's
// CPU, on a server of its own with fsync on, as production runs: per row and
// per batch statement, at two batch sizes (one batch is in flight at a time,
// so closed-loop submitters make batches of about half their number), with
// the schema whole and with one part of it dropped (in the benchmark's own
// database, to price that part alone: the per-shard counts' trigger, or one
// of the orders' secondary indexes):
//
//	go test -run '^$' -bench MaterializerPostgresCPU -benchtime 40000x ./runtime/ledger/
//
// A batch of B rows costs about F + r·B; the two sizes give F and r, and so
// what a row costs at the batch sizes a storm makes (docs/tuning.md).
func BenchmarkMaterializerPostgresCPU(b *testing.B) {
	pg, err := testharness.StartPostgresArgs("fsync=on", "synchronous_commit=on")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = pg.Close() })
	for _, submitters := range []int{16, 64} {
		for _, w := range schemaParts {
			name := fmt.Sprintf("submitters=%d/without=%s", submitters, w.name)
			b.Run(name, func(b *testing.B) { benchPostgresCPU(b, pg, submitters, w.drop) })
		}
	}
}

// schemaParts are what BenchmarkMaterializerPostgresCPU prices by dropping
// them, one at a time. The primary key is the request's (0007).
var schemaParts = []struct{ name, drop string }{
	{"nothing", ""},
	{"counts", "DROP TRIGGER flashsale_orders_count_insert ON flashsale_orders"},
	{"primary-key", "ALTER TABLE flashsale_orders DROP CONSTRAINT flashsale_orders_pkey"},
	{"holder-index", "DROP INDEX flashsale_orders_holder_idx"},
	{"pending-index", "DROP INDEX flashsale_orders_pending_idx"},
}

func benchPostgresCPU(b *testing.B, pg *testharness.Postgres, submitters int, drop string) {
	l := openLedger(b, newDSN(b, pg))
	const shards = 10
	// Ids like production's (a UID campaign, "<shard>.<key>" reservations
	// with 12 random bytes of key in base64url): the campaign id leads every
	// index of the orders, and random keys land all over their indexes.
	c, _, err := l.EnsureCampaign(testCtx(b), Campaign{
		ID: string(uuid.NewUUID()), Namespace: "shop", Name: "drop", SKU: "itm-ps5-pro",
		Allocation: 1 << 40, Shards: shards,
	})
	if err != nil {
		b.Fatal(err)
	}
	if drop != "" {
		if _, err := l.pool.Exec(testCtx(b), drop); err != nil {
			b.Fatal(err)
		}
	}
	var stats batchStats
	m := l.NewMaterializer(MaterializerConfig{OnBatch: stats.hook})
	defer m.Close()
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	// Every variant starts after a checkpoint, so each pays the full-page
	// writes that follow one instead of whichever one lands in it.
	if _, err := l.pool.Exec(testCtx(b), "CHECKPOINT"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu0 := cpustat.TreeWithExited(pg.PID())
	for s := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprintf("buyer-%d", s)
			for left.Add(-1) >= 0 {
				o := pendingOrder(c, user, s%shards, time.Hour)
				o.ReservationID = productionID(o.Shard)
				if err := m.Submit(ctx, o); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	cpu := cpustat.TreeWithExited(pg.PID()) - cpu0
	b.StopTimer()
	batches, rows, _ := stats.summary()
	if rows != b.N {
		b.Fatalf("%d rows written, want %d", rows, b.N)
	}
	us := float64(cpu) / float64(time.Microsecond)
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64(rows)/float64(batches), "rows/batch")
	b.ReportMetric(us/float64(rows), "pg-µs/row")
	b.ReportMetric(us/float64(batches), "pg-µs/batch")
}

// productionID is a reservation id shaped as stock.FormatID makes them: the
// shard, a dot and 12 bytes of HMAC in base64url (random here).
func productionID(shard int) string {
	var key [12]byte
	_, _ = rand.Read(key[:])
	return strconv.Itoa(shard) + "." + base64.RawURLEncoding.EncodeToString(key[:])
}

// BenchmarkCancelExpiredPostgresCPU prices the sweeper's cancel in
// PostgreSQL's CPU per order: b.N expired PENDING orders of one sale,
// cancelled in the sweeper's batches of 256 ids (each shard's in random
// order, as its expiry index gives them), with their statuses read back:
//
//	go test -run '^$' -bench CancelExpiredPostgresCPU -benchtime 20000x ./runtime/ledger/
func BenchmarkCancelExpiredPostgresCPU(b *testing.B) {
	pg, err := testharness.StartPostgresArgs("fsync=on", "synchronous_commit=on")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = pg.Close() })
	const batch = 256
	l := openLedger(b, newDSN(b, pg))
	ctx := testCtx(b)
	c := newCampaign(b, l, int64(b.N), 4)
	if _, err := l.pool.Exec(ctx, sqlTestBulkOrders, c.ID, b.N, string(StatusPending)); err != nil {
		b.Fatal(err)
	}
	rows, err := l.pool.Query(ctx, `SELECT reservation_id FROM flashsale_orders
WHERE campaign_id = $1 ORDER BY shard, random()`, c.ID)
	if err != nil {
		b.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{"ANALYZE flashsale_orders", "CHECKPOINT"} {
		if _, err := l.pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	cpu0 := cpustat.TreeWithExited(pg.PID())
	cancelled := 0
	for ids := range slices.Chunk(ids, batch) {
		got, err := l.CancelExpired(ctx, c.ID, ids, 0)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range got {
			if s == StatusCancelledBySweeper {
				cancelled++
			}
		}
	}
	cpu := cpustat.TreeWithExited(pg.PID()) - cpu0
	b.StopTimer()
	if cancelled != b.N {
		b.Fatalf("%d orders cancelled, want %d", cancelled, b.N)
	}
	b.ReportMetric(float64(cpu)/float64(time.Microsecond)/float64(b.N), "pg-µs/order")
}
