package main

import (
	"bytes"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/flashsale-dev/flashsale-operator/internal/promtext"
)

// The slow counts read the histogram series as client_golang writes them
// (labels, then le), so a storm's few stalled requests show beside the means.
func TestServerMetricsCountsWhatIsOverTheBound(t *testing.T) {
	reg := prometheus.NewRegistry()
	buckets := []float64{.01, .025, .05}
	req := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "flashsale_api_request_duration_seconds", Buckets: buckets}, []string{"route"})
	script := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "flashsale_redis_script_duration_seconds", Buckets: buckets}, []string{"script"})
	batch := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "flashsale_ledger_batch_duration_seconds", Buckets: buckets})
	reg.MustRegister(req, script, batch)
	page := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
		m, err := promtext.Parse(&b)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	// Before the storm: one slow request already counted, which must not count.
	req.WithLabelValues("reserve").Observe(0.2)
	before := page()
	for _, v := range []float64{0.001, 0.02, 0.03, 0.2} {
		req.WithLabelValues("reserve").Observe(v)
		req.WithLabelValues("checkout").Observe(1) // another route
		script.WithLabelValues("reserve").Observe(v / 2)
		batch.Observe(v * 2)
	}
	m := serverMetrics(before, page())
	if m.SlowRequests != 2 || m.SlowScripts != 1 || m.SlowBatches != 3 {
		t.Fatalf("over 25 ms: requests %v, script calls %v, batches %v; want 2, 1, 3", m.SlowRequests, m.SlowScripts, m.SlowBatches)
	}
}
