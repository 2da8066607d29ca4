package api

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	// DefaultMaxInFlight is Config.MaxInFlight's default: the most buyer
	// requests taken in at once, working and waiting.
	DefaultMaxInFlight = 16384
	// DefaultWorking is how many of them do their Redis and ledger work at
	// once: on two cores 1,024 buyers at once were served at 0.95–1.02 of
	// 256 (docs/capacity-runs-pipelined.md), so more only queue inside the
	// pipelines and the ledger's batches, where a request cannot leave
	// without its work (a reservation whose answer came too late is
	// released after).
	DefaultWorking = 1024
)

// inFlight bounds the buyer requests doing their Redis and ledger work to
// its places. One more waits in line, first come first served, until a
// place frees, for at most wait (half the request deadline, so that the
// work has the other half); it is refused when it waited that long, when
// its client went away, or at once when the line is full (max taken in).
//
// Why a line and not a refusal at once: buyers refused at once come back at
// once, and their refusals take the CPU of the requests admitted. A bound of
// 1024 refused at once let through half the reservations of no bound under
// 2,048–4,096 buyers, and a bound that followed what the process served
// could hold itself down (docs/capacity-runs-overload.md). A request in line
// costs a goroutine and a timer, no CPU; it is refused only when the process
// does not drain the line within wait, half the deadline: a queue that
// would take longer leaves its work too little time.
type inFlight struct {
	places  chan struct{} // one token per request at work; nil: no bound
	lineMax int64         // the most waiting
	wait    time.Duration

	n       atomic.Int64 // at work
	waiting atomic.Int64 // in line
}

// Whether a request was let in, and why not.
const (
	admitted = iota
	lineFull
	waitedTooLong
	clientGone
)

// shedReasons are the reason labels of flashsale_api_shed_total, by why a
// request was not let in.
var shedReasons = map[int]string{lineFull: "line_full", waitedTooLong: "waited", clientGone: "client_gone"}

// init sets the bound: places for working requests, the rest of max in line;
// max <= 0 sets no bound.
func (f *inFlight) init(max, working int, wait time.Duration) {
	if max <= 0 {
		return
	}
	w := min(max, working)
	f.places, f.lineMax, f.wait = make(chan struct{}, w), int64(max-w), wait
}

// enter takes a place, waiting in line for one if none is free. The channel
// keeps the line first come first served: a place that frees goes to the
// request that waited longest, never to one that just came (only to one
// about to park behind the others). ctx is the request's: one whose client
// goes away leaves the line; its Done is asked for only then, off the path
// of a request that finds a place free.
func (f *inFlight) enter(ctx context.Context) int {
	if f.places == nil {
		f.n.Add(1)
		return admitted
	}
	select {
	case f.places <- struct{}{}:
		f.n.Add(1)
		return admitted
	default:
	}
	// Compare-and-swap, not add-then-undo: a refused request's passing +1
	// would refuse another that had room.
	for {
		w := f.waiting.Load()
		if w >= f.lineMax {
			return lineFull
		}
		if f.waiting.CompareAndSwap(w, w+1) {
			break
		}
	}
	defer f.waiting.Add(-1)
	t := time.NewTimer(f.wait)
	defer t.Stop()
	select {
	case f.places <- struct{}{}:
		f.n.Add(1)
		return admitted
	case <-t.C:
		return waitedTooLong
	case <-ctx.Done():
		return clientGone
	}
}

// leave gives the place back, to the first request in line if any.
func (f *inFlight) leave() {
	f.n.Add(-1)
	if f.places != nil {
		<-f.places
	}
}

// begin starts a buyer request's Redis and ledger work, after its token and
// body have been checked: it returns the work's context, or a 503 when no
// place freed in time. The deadline starts before the wait in line, so the
// answer stays within the request deadline. A nil error must be followed by
// s.end().
func (s *Server) begin(r *http.Request) (context.Context, *apiError) {
	ctx := s.deadlines.context()
	var msg string
	why := s.inFlight.enter(r.Context())
	switch why {
	case admitted:
		return ctx, nil
	case lineFull:
		msg = fmt.Sprintf("overloaded: %d requests are in progress here and %d wait for a place, the most it takes; retry", s.inFlight.n.Load(), s.inFlight.lineMax)
	case waitedTooLong:
		msg = fmt.Sprintf("overloaded: no place among the %d requests in progress here freed within %v; retry", cap(s.inFlight.places), s.inFlight.wait)
	case clientGone:
		msg = "the client went away while the request waited for a place"
	}
	s.metrics.shed.WithLabelValues(shedReasons[why]).Inc()
	return nil, unavailable(msg)
}

func (s *Server) end() { s.inFlight.leave() }

// inFlightGauges report the requests at work and in line as Prometheus reads
// them: nothing per request.
func (s *Server) inFlightGauges() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashsale_api_in_flight",
			Help: "Buyer requests (reserve, checkout, cancel, the list of reservations) doing their Redis and ledger work now.",
		}, func() float64 { return float64(s.inFlight.n.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashsale_api_waiting",
			Help: "Buyer requests waiting in line for a place to do their Redis and ledger work (at most half the request deadline, and until their client goes).",
		}, func() float64 { return float64(s.inFlight.waiting.Load()) }),
	}
}
