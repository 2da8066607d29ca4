package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/promtext"
)

// ServerMetrics is what the reserve process's own /metrics say about the
// measured storm (differences of its counters across the storm): where a
// request's time goes inside the server.
type ServerMetrics struct {
	RequestMeanMs         float64 `json:"request_mean_ms"`          // routing to last byte, reserve route
	ScriptMeanMs          float64 `json:"script_mean_ms"`           // one reserve script call, as the server saw it
	ScriptCallsPerRequest float64 `json:"script_calls_per_request"` // home shard plus steal probes
	Batches               float64 `json:"ledger_batches"`
	BatchMeanRows         float64 `json:"ledger_batch_mean_rows"`
	BatchMeanMs           float64 `json:"ledger_batch_mean_ms"` // one group-commit transaction
	// How many took longer than 25 ms, from the histograms' buckets:
	// a tail made of one stall shows here, not in the means.
	SlowRequests float64 `json:"slow_requests"`
	SlowScripts  float64 `json:"slow_script_calls"`
	SlowBatches  float64 `json:"slow_ledger_batches"`
	// The 99th percentiles, interpolated within the histograms' buckets as
	// Prometheus's histogram_quantile does: set beside the client's p99,
	// they say whether a storm's tail is spent inside the process or outside
	// it (the client, the kernel, waiting for a core).
	RequestP99Ms float64 `json:"request_p99_ms"`
	ScriptP99Ms  float64 `json:"script_p99_ms"`
	BatchP99Ms   float64 `json:"ledger_batch_p99_ms"`
}

// scrape reads a Prometheus text page into series -> value ("" when absent).
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return promtext.Parse(resp.Body)
}

// serverMetrics derives ServerMetrics from two scrapes.
func serverMetrics(before, after map[string]float64) *ServerMetrics {
	d := func(series string) float64 { return after[series] - before[series] }
	mean := func(sum, count string) float64 {
		if n := d(count); n > 0 {
			return d(sum) / n
		}
		return 0
	}
	m := &ServerMetrics{
		RequestMeanMs: 1000 * mean(`flashsale_api_request_duration_seconds_sum{route="reserve"}`, `flashsale_api_request_duration_seconds_count{route="reserve"}`),
		ScriptMeanMs:  1000 * mean(`flashsale_redis_script_duration_seconds_sum{script="reserve"}`, `flashsale_redis_script_duration_seconds_count{script="reserve"}`),
		Batches:       d("flashsale_ledger_batch_size_count"),
		BatchMeanRows: mean("flashsale_ledger_batch_size_sum", "flashsale_ledger_batch_size_count"),
		BatchMeanMs:   1000 * mean("flashsale_ledger_batch_duration_seconds_sum", "flashsale_ledger_batch_duration_seconds_count"),
	}
	// Observations above 25 ms, a bucket bound of the process's latency
	// histograms: the count less that bucket.
	m.SlowRequests = d(`flashsale_api_request_duration_seconds_count{route="reserve"}`) - d(`flashsale_api_request_duration_seconds_bucket{route="reserve",le="0.025"}`)
	m.SlowScripts = d(`flashsale_redis_script_duration_seconds_count{script="reserve"}`) - d(`flashsale_redis_script_duration_seconds_bucket{script="reserve",le="0.025"}`)
	m.SlowBatches = d("flashsale_ledger_batch_duration_seconds_count") - d(`flashsale_ledger_batch_duration_seconds_bucket{le="0.025"}`)
	m.RequestP99Ms = 1000 * histogramQuantile(0.99, before, after, `flashsale_api_request_duration_seconds_bucket{route="reserve",`)
	m.ScriptP99Ms = 1000 * histogramQuantile(0.99, before, after, `flashsale_redis_script_duration_seconds_bucket{script="reserve",`)
	m.BatchP99Ms = 1000 * histogramQuantile(0.99, before, after, "flashsale_ledger_batch_duration_seconds_bucket{")
	if n := d(`flashsale_api_request_duration_seconds_count{route="reserve"}`); n > 0 {
		m.ScriptCallsPerRequest = d("flashsale_reserve_script_calls_total") / n
	}
	return m
}

// histogramQuantile is the q-quantile of what a histogram observed between
// two scrapes: its bucket series start with prefix (the name, "_bucket{" and
// any other labels) and end in le="<bound>"}. The quantile is interpolated
// linearly within its bucket, and one in the +Inf bucket is the highest
// finite bound. 0 when nothing was observed.
func histogramQuantile(q float64, before, after map[string]float64, prefix string) float64 {
	type bucket struct{ le, count float64 }
	var bs []bucket
	for series, v := range after {
		rest, ok := strings.CutPrefix(series, prefix+`le="`)
		if !ok {
			continue
		}
		bound, ok := strings.CutSuffix(rest, `"}`)
		if !ok {
			continue
		}
		le, err := strconv.ParseFloat(bound, 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, v - before[series]})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	if len(bs) == 0 || bs[len(bs)-1].count <= 0 {
		return 0
	}
	rank := q * bs[len(bs)-1].count
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return lower
			}
			// b.count > below: an earlier bucket would have held the rank.
			return lower + (b.le-lower)*(rank-below)/(b.count-below)
		}
		lower, below = b.le, b.count
	}
	return lower
}
