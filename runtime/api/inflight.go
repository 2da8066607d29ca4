package api

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	// DefaultMaxInFlight is Config.MaxInFlight's default: the ceiling of
	// the bound, which follows what the process serves (inFlight).
	DefaultMaxInFlight = 16384
	// minInFlight is the bound's floor: what a process that has served
	// little yet (a sale's first moments) admits, about 0.8 s of work at
	// the 1,250 reservations/s of a quarter of a core, within half the
	// default deadline.
	minInFlight = 1024
	// inFlightSample is how often the bound follows the rate.
	inFlightSample = 250 * time.Millisecond
)

// inFlight counts the buyer requests doing their Redis and ledger work, and
// bounds them: one more than the bound is refused at once. Under overload a
// queue longer than the process drains within a deadline only turns every
// request into a 503 after RequestTimeout, and holds its client, its
// connection and its place in the pipelines meanwhile; a bound below what
// the process drains refuses load it serves, and costs reservations, since
// buyers refused at once come back at once and their refusals take the
// CPU (docs/capacity-runs-overload.md). No count fits every
// pod's CPU, so the bound is what the process finished in the last
// inFlightSample times wait, half the deadline: an admitted request then
// waits about that long behind the others, and has the other half for its
// own work. (A fifth of a 1 s deadline refused buyers the process served
// within 0.52 s, and halved the reservations.) It stays within
// [min(minInFlight, max), max].
type inFlight struct {
	max  int64         // the ceiling; 0: no bound
	wait time.Duration // what an admitted request may wait behind the others
	now  func() time.Time

	n     atomic.Int64
	limit atomic.Int64 // the bound now
	done  atomic.Int64 // requests finished

	mu      sync.Mutex   // one sample at a time
	sampled atomic.Int64 // when the last sample was taken, unix nanoseconds
	doneAt  int64        // done at that sample; under mu
}

func (f *inFlight) init(ceiling int, wait time.Duration, now func() time.Time) {
	f.max, f.wait, f.now = int64(max(ceiling, 0)), wait, now
	f.limit.Store(min(minInFlight, f.max))
	f.sampled.Store(now().UnixNano())
}

// enter takes a place, or refuses when the bound's places are taken.
// Compare-and-swap, not add-then-undo: a refused request's passing +1 would
// refuse another that had a place.
func (f *inFlight) enter() bool {
	if f.max > 0 {
		f.follow()
	}
	for {
		n := f.n.Load()
		if f.max > 0 && n >= f.limit.Load() {
			return false
		}
		if f.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (f *inFlight) leave() {
	f.n.Add(-1)
	f.done.Add(1)
}

// follow sets the bound from the rate requests finished at since the last
// sample, once inFlightSample has passed; one caller samples, the others go
// on with the bound as it is.
func (f *inFlight) follow() {
	now, last := f.now().UnixNano(), f.sampled.Load()
	if now-last < int64(inFlightSample) || !f.mu.TryLock() {
		return
	}
	defer f.mu.Unlock()
	if f.sampled.Load() != last {
		return // sampled meanwhile
	}
	done := f.done.Load()
	rate := float64(done-f.doneAt) / time.Duration(now-last).Seconds()
	f.limit.Store(min(max(int64(rate*f.wait.Seconds()), minInFlight), f.max))
	f.doneAt = done
	f.sampled.Store(now)
}

// begin starts a buyer request's Redis and ledger work, after its token and
// body have been checked: it returns the work's context, or a 503 when the
// bound's requests are doing theirs. A nil error must be followed by
// s.end().
func (s *Server) begin() (context.Context, *apiError) {
	if !s.inFlight.enter() {
		s.metrics.shed.Inc()
		return nil, unavailable(fmt.Sprintf("overloaded: %d requests are in progress here; retry", s.inFlight.limit.Load()))
	}
	return s.deadlines.context(), nil
}

func (s *Server) end() { s.inFlight.leave() }

// inFlightGauges report the count and the bound as Prometheus reads them:
// nothing per request.
func (s *Server) inFlightGauges() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashsale_api_in_flight",
			Help: "Buyer requests (reserve, checkout, cancel) doing their Redis and ledger work now.",
		}, func() float64 { return float64(s.inFlight.n.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashsale_api_in_flight_limit",
			Help: "The most buyer requests admitted at once now: what the process finished in the last quarter second, times half the request deadline, within the floor and --max-in-flight (0: no bound).",
		}, func() float64 { return float64(s.inFlight.limit.Load()) }),
	}
}
