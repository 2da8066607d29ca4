package ledger

import (
	"context"
	"testing"
	"time"
)

// BenchmarkMaterializer measures durable PENDING rows per second with many
// concurrent submitters (-cpu or SetParallelism scale the submitters):
//
//	go test -run '^$' -bench Materializer -benchtime 20000x ./runtime/ledger/
func BenchmarkMaterializer(b *testing.B) {
	l := newLedger(b)
	c := newCampaign(b, l, 1<<40, 10)
	var stats batchStats
	m := l.NewMaterializer(MaterializerConfig{OnBatch: stats.hook})
	defer m.Close()
	ctx := context.Background()
	b.SetParallelism(64) // 64 × GOMAXPROCS submitters, like API handlers
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := m.Submit(ctx, pendingOrder(c, "bench", 0, time.Hour)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	batches, rows, _ := stats.summary()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	if batches > 0 {
		b.ReportMetric(float64(rows)/float64(batches), "rows/batch")
	}
}
