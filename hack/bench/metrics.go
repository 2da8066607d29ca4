package main

import (
	"context"
	"fmt"
	"net/http"
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
	if n := d(`flashsale_api_request_duration_seconds_count{route="reserve"}`); n > 0 {
		m.ScriptCallsPerRequest = d("flashsale_reserve_script_calls_total") / n
	}
	return m
}
