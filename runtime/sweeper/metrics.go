package sweeper

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// Metrics are the sweeper's Prometheus metrics.
type Metrics struct {
	passes       *prometheus.CounterVec
	reservations *prometheus.CounterVec
	reapedClaims prometheus.Counter
	deferred     prometheus.Counter
	duration     prometheus.Histogram
	leader       prometheus.Gauge
	interval     prometheus.Gauge
	lastPass     prometheus.Gauge
}

// NewMetrics registers the sweeper metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_sweeper_passes_total",
			Help: "Sweep passes run by this replica, by result (ok; cut: stopped at its time limit with work left, the next starts at once; error).",
		}, []string{"result"}),
		reservations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_sweeper_reservations_total",
			Help: "Expired reservations handled, by outcome: released (units back to stock), committed (Redis cleaned after a checkout), abandoned (no ledger row: recorded, then released), skipped (not yet expired by the database clock, or shard rebuilding).",
		}, []string{"outcome"}),
		reapedClaims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_sweeper_reaped_claims_total",
			Help: "Quota given back on home shards: steal claims whose placing process died before confirming them, and released stolen reservations whose give-back had failed.",
		}),
		deferred: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_sweeper_quota_deferred_total",
			Help: "Released stolen reservations whose quota give-back on their home shard failed, or was not sent after one to that shard failed in the pass: its claim reaper gives it back once that shard answers.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flashsale_sweeper_pass_duration_seconds",
			Help:    "Duration of one sweep pass over every shard.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16), // 1ms .. ~33s
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_sweeper_leader",
			Help: "1 while this replica holds the sweeper leadership, else 0.",
		}),
		interval: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_sweeper_interval_seconds",
			Help: "The time between two passes when no backlog is left (spec.sweeper.interval).",
		}),
		lastPass: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_sweeper_last_pass_timestamp_seconds",
			Help: "When this replica last finished a pass (ok or cut), in seconds since the epoch; 0 before its first.",
		}),
	}
	for _, r := range []string{"ok", "cut", "error"} {
		m.passes.WithLabelValues(r)
	}
	for _, o := range []string{"released", "committed", "abandoned", "skipped"} {
		m.reservations.WithLabelValues(o)
	}
	reg.MustRegister(m.passes, m.reservations, m.reapedClaims, m.deferred, m.duration, m.leader, m.interval, m.lastPass)
	return m
}

func (m *Metrics) setInterval(d time.Duration) {
	if m != nil {
		m.interval.Set(d.Seconds())
	}
}

func (m *Metrics) setLeader(leading bool) {
	if m == nil {
		return
	}
	if leading {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}

func (m *Metrics) observePass(st engine.SweepStats, d time.Duration, err error, cut bool) {
	if m == nil {
		return
	}
	result := "ok"
	switch {
	case cut:
		result = "cut"
	case err != nil:
		result = "error"
	}
	if result != "error" {
		m.lastPass.SetToCurrentTime()
	}
	m.passes.WithLabelValues(result).Inc()
	m.duration.Observe(d.Seconds())
	m.reservations.WithLabelValues("released").Add(float64(st.Released))
	m.reservations.WithLabelValues("committed").Add(float64(st.Committed))
	m.reservations.WithLabelValues("abandoned").Add(float64(st.Abandoned))
	m.reservations.WithLabelValues("skipped").Add(float64(st.Skipped))
	m.reapedClaims.Add(float64(st.ReapedClaims))
	m.deferred.Add(float64(st.QuotaDeferred))
}
