package stock

import (
	"context"
	"fmt"
	"time"
)

// Reading is one server's clock against this process's: Offset is the
// server's time minus this process's at the middle of the round trip, and
// the server read it at most Uncertainty either side of that middle.
type Reading struct {
	Server      string
	Offset      time.Duration
	Uncertainty time.Duration
}

// ClockReadings is how many times a clock is read for one Reading, which
// keeps the read with the shortest round trip: one slowed by a scheduling
// delay or a busy server would widen the uncertainty past what it can tell.
const ClockReadings = 3

// Clocks reads the clock of every server holding the campaign's shards: the
// clock the reserve script sets each reservation's expiry with.
func (s *Store) Clocks(ctx context.Context) ([]Reading, error) {
	nodes, err := s.shardServers(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Reading, 0, len(nodes))
	for _, node := range nodes {
		addr := node.Options().Addr
		best, err := BestReading(func() (Reading, error) {
			before := time.Now()
			at, err := node.Time(ctx).Result()
			return NewReading(addr, at, before, time.Now()), err
		})
		if err != nil {
			s.redirected(ctx, err)
			return nil, fmt.Errorf("%s: %w", addr, err)
		}
		out = append(out, best)
	}
	return out, nil
}

// BestReading reads a clock ClockReadings times and keeps the reading with
// the shortest round trip (a first one that opened the connection, or one
// slowed by a scheduling delay, is left out).
func BestReading(read func() (Reading, error)) (Reading, error) {
	var best Reading
	for i := range ClockReadings {
		r, err := read()
		if err != nil {
			return Reading{}, err
		}
		if i == 0 || r.Uncertainty < best.Uncertainty {
			best = r
		}
	}
	return best, nil
}

// NewReading is the reading of a server that said it was at, asked between
// before and after by this process's clock.
func NewReading(server string, at, before, after time.Time) Reading {
	half := after.Sub(before) / 2
	return Reading{Server: server, Offset: at.Sub(before.Add(half)), Uncertainty: half}
}
