package api

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Metrics are the reserve process's Prometheus metrics, on their own registry so
// that nothing global (and no other package's metrics) leaks into /metrics.
type Metrics struct {
	reg *prometheus.Registry

	requests      *prometheus.CounterVec
	shed          *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	scriptCalls   prometheus.Counter
	scriptLatency *prometheus.HistogramVec
	// reserveScript and otherScript are scriptLatency's two series, looked up
	// once (on first use, so an unused one is not exported).
	reserveScript, otherScript func() prometheus.Observer
	batchSize                  prometheus.Histogram
	batchLatency               prometheus.Histogram
}

// latencyBuckets resolve the sub-millisecond range, where a healthy reserve lives,
// and reach the request timeout.
var latencyBuckets = []float64{.0002, .0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1, 2.5, 5}

// NewMetrics registers the metrics, with the Go runtime and process collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_api_requests_total",
			Help: "HTTP requests by route and outcome code (a success code such as RESERVED, or the error code).",
		}, []string{"route", "code"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_api_shed_total",
			Help: "Buyer requests answered 503 UNAVAILABLE without their Redis and ledger work, by reason: waited (no place freed within half the request deadline), line_full (--max-in-flight taken in), client_gone (the client left the line).",
		}, []string{"reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "flashsale_api_request_duration_seconds",
			Help:    "HTTP request latency by route, from routing to the last byte written.",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		scriptCalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_reserve_script_calls_total",
			Help: "Reserve script calls made by reservations (the home shard plus steal probes).",
		}),
		scriptLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "flashsale_redis_script_duration_seconds",
			Help:    "Latency of Redis script calls as seen by this process, by script (reserve or other).",
			Buckets: latencyBuckets,
		}, []string{"script"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flashsale_ledger_batch_size",
			Help:    "PENDING rows written per group-commit transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
		}),
		batchLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flashsale_ledger_batch_duration_seconds",
			Help:    "Duration of one group-commit transaction.",
			Buckets: latencyBuckets,
		}),
	}
	m.reserveScript = sync.OnceValue(func() prometheus.Observer { return m.scriptLatency.WithLabelValues("reserve") })
	m.otherScript = sync.OnceValue(func() prometheus.Observer { return m.scriptLatency.WithLabelValues("other") })
	for _, reason := range shedReasons {
		m.shed.WithLabelValues(reason) // every reason from 0, so that rate() sees the first refusal
	}
	m.reg.MustRegister(m.requests, m.shed, m.latency, m.scriptCalls, m.scriptLatency, m.batchSize, m.batchLatency,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is where the metrics live (for /metrics and tests).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ObserveBatch is a ledger.MaterializerConfig.OnBatch.
func (m *Metrics) ObserveBatch(size int, d time.Duration) {
	m.batchSize.Observe(float64(size))
	m.batchLatency.Observe(d.Seconds())
}

// RedisHook times script calls; add it to the Redis client the engine uses
// with stock.AddHook.
func (m *Metrics) RedisHook() redis.Hook { return scriptHook{m: m} }

type scriptHook struct{ m *Metrics }

func (h scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook times reserve calls batched into a pipeline
// (stock.PipelineConfig): each is observed with the whole pipeline's time.
// The time a call waited for its pipeline to go is not in it: the request
// latency shows it.
func (h scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		d := time.Since(start).Seconds()
		for _, cmd := range cmds {
			if args := cmd.Args(); cmd.Name() == "evalsha" && len(args) > 1 {
				if s, ok := args[1].(string); ok && stock.IsReserveScript(s) {
					h.m.reserveScript().Observe(d)
				}
			}
		}
		return err
	}
}

func (h scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		start := time.Now()
		err := next(ctx, cmd)
		obs := h.m.otherScript
		if args := cmd.Args(); len(args) > 1 {
			if s, ok := args[1].(string); ok && (name == "evalsha" && stock.IsReserveScript(s) || name == "eval" && stock.IsReserveScript(sha1Hex(s))) {
				obs = h.m.reserveScript
			}
		}
		obs().Observe(time.Since(start).Seconds())
		return err
	}
}

var (
	stockAvailableDesc = prometheus.NewDesc("flashsale_stock_available", "Units in stock on a shard (Redis), as of the cached availability read.", []string{"shard"}, nil)
	stockReservedDesc  = prometheus.NewDesc("flashsale_stock_reserved", "Units held by live reservations on a shard (Redis).", []string{"shard"}, nil)
	shardOpenDesc      = prometheus.NewDesc("flashsale_shard_open", "1 when the shard's gate is OPEN under a present meta, else 0.", []string{"shard"}, nil)
)

// stockCollector reports the shards from the server's cached snapshot, so a scrape
// costs at most one Redis pipeline per cache period.
type stockCollector struct{ s *Server }

func (c stockCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- stockAvailableDesc
	ch <- stockReservedDesc
	ch <- shardOpenDesc
}

func (c stockCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	snap, err := c.s.snapshot(ctx)
	if err != nil {
		return // no stock figures is better than stale or invented ones
	}
	for _, sh := range snap.shards {
		label := strconv.Itoa(sh.Index)
		open := 0.0
		if sh.Present && sh.State == stock.StateOpen && !sh.Unverified {
			open = 1
		}
		ch <- prometheus.MustNewConstMetric(stockAvailableDesc, prometheus.GaugeValue, float64(sh.Available), label)
		ch <- prometheus.MustNewConstMetric(stockReservedDesc, prometheus.GaugeValue, float64(sh.Reserved), label)
		ch <- prometheus.MustNewConstMetric(shardOpenDesc, prometheus.GaugeValue, open, label)
	}
}

// sha1Hex names a script by its source the way EVALSHA does; only the rare EVAL
// fallback (after a Redis restart flushed the script cache) pays for it.
func sha1Hex(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}
