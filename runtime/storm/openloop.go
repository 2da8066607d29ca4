package storm

import (
	"context"
	"math"
	"math/rand/v2"
	"time"
)

// maxRate bounds --rate: beyond it the schedule's step is under a
// microsecond and no client on one machine keeps it.
const maxRate = 1e6

// worker runs journeys until the count, the duration or ctx ends the storm.
//
// Closed loop (Rate 0): the next journey starts when the last one ended, so
// a slow server slows the storm down and the latencies never see the queue
// it would have built (coordinated omission).
//
// Open loop (Rate > 0), as wrk2 and vegeta do: journey j is due at
// scheduleAt(start, Rate, j) whether or not earlier answers came back. A
// worker takes the next journey, waits for its due time when that is still
// ahead, and sends; when every connection is busy, journeys start late and
// the lateness is in their latency, which is measured from the due time, not
// from the send.
func (s *stormer) worker(ctx context.Context, start, deadline time.Time, st *workerStats) {
	for {
		// The open loop ends by due time only: a journey due before the end is
		// sent however late, or the most delayed would go uncounted.
		if ctx.Err() != nil || s.cfg.Rate == 0 && !deadline.IsZero() && !s.cfg.Now().Before(deadline) {
			return
		}
		j := s.next.Add(1) - 1
		if s.cfg.Count > 0 && j >= int64(s.cfg.Count) {
			return
		}
		var due time.Time
		if s.cfg.Rate > 0 {
			due = scheduleAt(start, s.cfg.Rate, j)
			if !deadline.IsZero() && !due.Before(deadline) {
				return // scheduled after the end of the storm: never sent
			}
			if wait := due.Sub(s.cfg.Now()); wait > 0 {
				s.cfg.Sleep(ctx, wait)
				if ctx.Err() != nil {
					return
				}
			}
		}
		// One generator per journey: its choices depend on the seed and the
		// journey number only, not on which worker ran it.
		s.journey(ctx, j, due, rand.New(rand.NewPCG(s.cfg.Seed, uint64(j))), st)
		s.journeys.Add(1)
	}
}

// scheduleAt is when journey j is due in an open-loop storm at rate journeys
// per second: j/rate seconds after start, computed from j (never by adding
// steps, so rounding does not drift over millions of journeys).
func scheduleAt(start time.Time, rate float64, j int64) time.Time {
	return start.Add(time.Duration(math.Round(float64(j) * float64(time.Second) / rate)))
}

// latency is how long a request took to be answered at done: from its due
// time when it has one (open loop), else from when it was sent. A request sent
// early (never, by construction) is not credited with negative time.
func latency(due, sent, done time.Time) time.Duration {
	from := sent
	if !due.IsZero() && due.Before(sent) {
		from = due
	}
	return max(done.Sub(from), 0)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
