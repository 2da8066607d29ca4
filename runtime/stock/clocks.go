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
		// A first call makes sure the connection is open, so the timed one
		// is one round trip.
		if err := node.Ping(ctx).Err(); err != nil {
			s.redirected(ctx, err)
			return nil, fmt.Errorf("%s: %w", node.Options().Addr, err)
		}
		var best Reading
		for i := range ClockReadings {
			before := time.Now()
			at, err := node.Time(ctx).Result()
			after := time.Now()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", node.Options().Addr, err)
			}
			if r := NewReading(node.Options().Addr, at, before, after); i == 0 || r.Uncertainty < best.Uncertainty {
				best = r
			}
		}
		out = append(out, best)
	}
	return out, nil
}

// NewReading is the reading of a server that said it was at, asked between
// before and after by this process's clock.
func NewReading(server string, at, before, after time.Time) Reading {
	half := after.Sub(before) / 2
	return Reading{Server: server, Offset: at.Sub(before.Add(half)), Uncertainty: half}
}
