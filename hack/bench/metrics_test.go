package main

import (
	"bytes"
	"math"
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
	// The slowest of four requests, batches and script calls is over the
	// highest bound (50 ms), so each p99 is that bound; the request counted
	// before the storm does not move it.
	if m.RequestP99Ms != 50 || m.BatchP99Ms != 50 || m.ScriptP99Ms != 50 {
		t.Fatalf("p99 ms: requests %v, batches %v, script calls %v", m.RequestP99Ms, m.BatchP99Ms, m.ScriptP99Ms)
	}
}

// The quantile is read from the buckets' differences across the storm,
// interpolated within its bucket as histogram_quantile does.
func TestHistogramQuantileInterpolatesWithinTheBucket(t *testing.T) {
	const p = `x_bucket{route="reserve",`
	series := func(counts ...float64) map[string]float64 {
		m := map[string]float64{}
		for i, le := range []string{"0.001", "0.005", "0.01", "+Inf"} {
			m[p+`le="`+le+`"}`] = counts[i]
			m[`x_bucket{route="other",le="`+le+`"}`] = 1000 // another label: ignored
		}
		return m
	}
	before := series(10, 10, 10, 10) // counted before the storm: ignored
	cases := map[string]struct {
		after map[string]float64
		q     float64
		want  float64
	}{
		// 100 observations: 50 below 1 ms, 40 in (1, 5] ms, 10 in (5, 10] ms.
		"p50 at the top of the first bucket":    {series(60, 100, 110, 110), 0.5, 0.001},
		"p70 halfway through (1, 5] ms":         {series(60, 100, 110, 110), 0.7, 0.003},
		"p99 nine tenths through (5, 10] ms":    {series(60, 100, 110, 110), 0.99, 0.0095},
		"in the +Inf bucket: the highest bound": {series(60, 100, 100, 110), 0.99, 0.01},
		"nothing observed":                      {series(10, 10, 10, 10), 0.99, 0},
	}
	for name, c := range cases {
		if got := histogramQuantile(c.q, before, c.after, p); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: got %v, want %v", name, got, c.want)
		}
	}
}
