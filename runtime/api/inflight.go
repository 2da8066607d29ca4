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
// CPU (docs/capacity-runs-overload.md). No count fits every pod's CPU, so
// the bound follows what the process serves: the requests that finished
// within wait (half the deadline) in the last inFlightSample, per second,
// times wait. An admitted request then waits about wait behind the others
// and has the other half for its own work. (A fifth of a 1 s deadline
// refused buyers the process served within 0.52 s, and halved the
// reservations.) It stays within [min(minInFlight, max), max], and it falls
// by at most a quarter a sample, and not at all over a sample in which the
// requests in flight stayed under three quarters of it: the rate then
// measured the demand, not what the process serves.
type inFlight struct {
	max  int64         // the ceiling; 0: no bound
	wait time.Duration // what an admitted request may wait behind the others
	now  func() time.Time
	base time.Time // times are nanoseconds since base: monotonic with time.Now

	n     atomic.Int64
	peak  atomic.Int64 // the most in flight since the last sample
	limit atomic.Int64 // the bound now
	done  atomic.Int64 // requests finished within wait

	mu      sync.Mutex   // one sample at a time
	sampled atomic.Int64 // when the last sample was taken
	doneAt  int64        // done at that sample; under mu
}

func (f *inFlight) init(ceiling int, wait time.Duration, now func() time.Time) {
	f.max, f.wait, f.now, f.base = int64(max(ceiling, 0)), wait, now, now()
	f.limit.Store(min(minInFlight, f.max))
}

// enter takes a place, or refuses when the bound's places are taken; it
// returns when it took it, for leave. Compare-and-swap, not add-then-undo:
// a refused request's passing +1 would refuse another that had a place.
func (f *inFlight) enter() (int64, bool) {
	if f.max <= 0 {
		f.n.Add(1)
		return 0, true
	}
	at := int64(f.now().Sub(f.base))
	f.follow(at)
	for {
		n := f.n.Load()
		if n >= f.limit.Load() {
			return 0, false
		}
		if f.n.CompareAndSwap(n, n+1) {
			for p := f.peak.Load(); n+1 > p && !f.peak.CompareAndSwap(p, n+1); p = f.peak.Load() {
			}
			return at, true
		}
	}
}

// leave gives the place back; a request that finished within wait counts
// as served (one that timed out behind a stalled Redis or ledger does not).
func (f *inFlight) leave(at int64) {
	f.n.Add(-1)
	if f.max > 0 && time.Duration(int64(f.now().Sub(f.base))-at) <= f.wait {
		f.done.Add(1)
	}
}

// follow sets the bound from the rate requests were served at since the
// last sample, once inFlightSample has passed; one caller samples, the
// others go on with the bound as it is.
func (f *inFlight) follow(now int64) {
	last := f.sampled.Load()
	if now-last < int64(inFlightSample) || !f.mu.TryLock() {
		return
	}
	defer f.mu.Unlock()
	if f.sampled.Load() != last {
		return // sampled meanwhile
	}
	done, old, peak := f.done.Load(), f.limit.Load(), f.peak.Swap(f.n.Load())
	rate := float64(done-f.doneAt) / time.Duration(now-last).Seconds()
	next := int64(rate * f.wait.Seconds())
	switch {
	case next >= old: // a rise, at once
	case peak < old*3/4:
		next = old // the demand, not the process, set the rate
	default:
		// A fall, a quarter a sample at most, so that one slow sample does
		// not refuse the buyers of the next.
		next = max(next, old*3/4)
	}
	f.limit.Store(min(max(next, minInFlight), f.max))
	f.doneAt = done
	f.sampled.Store(now)
}

// begin starts a buyer request's Redis and ledger work, after its token and
// body have been checked: it returns the work's context and when it began,
// or a 503 when the bound's requests are doing theirs. A nil error must be
// followed by s.end(began).
func (s *Server) begin() (context.Context, int64, *apiError) {
	began, ok := s.inFlight.enter()
	if !ok {
		s.metrics.shed.Inc()
		return nil, 0, unavailable(fmt.Sprintf("overloaded: %d requests are in progress here, the most it takes now; retry", s.inFlight.n.Load()))
	}
	return s.deadlines.context(), began, nil
}

func (s *Server) end(began int64) { s.inFlight.leave(began) }

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
			Help: "The most buyer requests admitted at once now: what the process served per second (within half the request deadline), times half the request deadline, within the floor and --max-in-flight (0: no bound).",
		}, func() float64 { return float64(s.inFlight.limit.Load()) }),
	}
}
