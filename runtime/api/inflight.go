package api

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxInFlight is Config.MaxInFlight's default: about a tenth of a
// second of work at the 10,000 reservations/s one process serves on two
// cores (docs/capacity.md), so an admitted request waits far less than its
// deadline, while no load a replica can serve is refused (a keep-alive
// connection has one request in flight; the benchmarks run 256).
const DefaultMaxInFlight = 1024

// inFlight counts the buyer requests doing their Redis and ledger work. Past
// max (0: no bound) a request is refused at once: under overload a queue
// longer than the process drains within a deadline only turns every request
// into a 503 after RequestTimeout, and holds its client, its connection and
// its place in the pipelines meanwhile.
type inFlight struct {
	max int64
	n   atomic.Int64
}

// enter takes a place, or refuses when max are taken. Compare-and-swap, not
// add-then-undo: a refused request's passing +1 would refuse another that had
// a place.
func (f *inFlight) enter() bool {
	for {
		n := f.n.Load()
		if f.max > 0 && n >= f.max {
			return false
		}
		if f.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (f *inFlight) leave() { f.n.Add(-1) }

// begin starts a buyer request's Redis and ledger work, after its token and
// body have been checked: it returns the work's context, or a 503 when
// MaxInFlight requests are doing theirs. A nil error must be followed by
// s.end().
func (s *Server) begin() (context.Context, *apiError) {
	if !s.inFlight.enter() {
		s.metrics.shed.Inc()
		return nil, unavailable(fmt.Sprintf("overloaded: %d requests are in progress here; retry", s.inFlight.max))
	}
	return s.deadlines.context(), nil
}

func (s *Server) end() { s.inFlight.leave() }

// inFlightGauge reports the count as Prometheus reads it: nothing per request.
func (s *Server) inFlightGauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "flashsale_api_in_flight",
		Help: "Buyer requests (reserve, checkout, cancel) doing their Redis and ledger work now.",
	}, func() float64 { return float64(s.inFlight.n.Load()) })
}
