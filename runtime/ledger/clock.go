package ledger

import (
	"context"
	"time"
)

// Clock reads the database's clock, the one that judges whether a
// reservation has expired (checkout, sweeper), and this process's clock just
// before and after it asked, on a connection already open.
func (l *Ledger) Clock(ctx context.Context) (at, before, after time.Time, err error) {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return at, before, after, failed("clock", err)
	}
	defer conn.Release()
	before = time.Now()
	err = conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&at)
	after = time.Now()
	if err != nil {
		return at, before, after, failed("clock", err)
	}
	return at, before, after, nil
}
