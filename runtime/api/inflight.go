package api

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxInFlight is Config.MaxInFlight's default: about 0.8 s of work
// at the 10,000 reservations/s one process serves on two cores
// (docs/capacity.md), a sixth of the default request deadline, so an
// admitted request still answers well within it. Lower refuses load the
// process serves: buyers refused at once come back at once, and their
// refusals take the CPU of the reservations. With 1024, 2,048 and 4,096
// buyers got 4,600–6,500 reservations/s among twice as many 503s or more,
// where the process without a bound served all of them at 10,500–12,200/s
// (p99 0.24–0.49 s; docs/capacity-runs-pipelined.md, "Overload").
const DefaultMaxInFlight = 8192

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
