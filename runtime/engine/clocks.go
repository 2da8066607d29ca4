package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// ClockSkew is how far the ledger's clock runs ahead of one Redis server's
// (negative: behind), give or take Uncertainty, half of the two round trips.
// A reservation's expires_at is set by the Redis server's clock and judged
// by the ledger's (checkout, sweeper), so a ledger ahead by Δ leaves every
// buyer Δ less to pay.
type ClockSkew struct {
	Server      string
	Ahead       time.Duration
	Uncertainty time.Duration
}

// AtLeast is the least the two clocks differ by, whatever the round trips
// hid: 0 when they may agree.
func (s ClockSkew) AtLeast() time.Duration {
	return max(s.Ahead.Abs()-s.Uncertainty, 0)
}

// ClockSkew compares the ledger's clock with that of every Redis server
// holding the sale's shards, each against this process's clock (the reading
// with the shortest round trip of a few), and returns the server whose clock
// differs most from the ledger's.
func (e *Engine) ClockSkew(ctx context.Context) (ClockSkew, error) {
	db, err := stock.BestReading(func() (stock.Reading, error) {
		at, before, after, err := e.ledger.Clock(ctx)
		return stock.NewReading("ledger", at, before, after), err
	})
	if err != nil {
		return ClockSkew{}, ledgerFailure("clock", err)
	}
	servers, err := e.store.Clocks(ctx)
	if err != nil {
		return ClockSkew{}, fmt.Errorf("redis: %w", err)
	}
	var worst ClockSkew
	for i, r := range servers {
		s := ClockSkew{Server: r.Server, Ahead: db.Offset - r.Offset, Uncertainty: db.Uncertainty + r.Uncertainty}
		if i == 0 || s.AtLeast() > worst.AtLeast() || (s.AtLeast() == worst.AtLeast() && s.Ahead.Abs() > worst.Ahead.Abs()) {
			worst = s
		}
	}
	return worst, nil
}
