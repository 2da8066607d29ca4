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
		before := time.Now()
		at, err := node.Time(ctx).Result()
		after := time.Now()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", node.Options().Addr, err)
		}
		out = append(out, NewReading(node.Options().Addr, at, before, after))
	}
	return out, nil
}

// NewReading is the reading of a server that said it was at, asked between
// before and after by this process's clock.
func NewReading(server string, at, before, after time.Time) Reading {
	half := after.Sub(before) / 2
	return Reading{Server: server, Offset: at.Sub(before.Add(half)), Uncertainty: half}
}
