package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"
)

// limitCommits is the physical-limits row of durable one-row transactions:
// what the SQL designs pay per reservation at the least, and what the
// ledger's group commit spreads over a batch.
const limitCommits = "PostgreSQL one-row INSERT commits"

// CommitOptions are the one-row commit run's settings.
type CommitOptions struct {
	Conns    int           `json:"conns"`
	Duration time.Duration `json:"duration"`
	MaxTx    int64         `json:"max_tx"`
}

func (c *CommitOptions) addFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.Conns, "limits-commit-conns", 64, "connections of the one-row commit run, each committing one INSERT at a time")
	fs.DurationVar(&c.Duration, "limits-commit-duration", 10*time.Second, "length of the one-row commit run")
	fs.Int64Var(&c.MaxTx, "limits-commit-max-tx", 2_000_000, "upper bound on the commits of that run, besides its duration")
}

// commitRows: Conns connections, each inserting one order row per
// transaction (autocommit) into a new database, for Duration or MaxTx
// commits. With fsync and synchronous_commit on, every commit waits for the
// WAL flush; concurrent commits share flushes (PostgreSQL's own group commit).
func (e *benchEnv) commitRows(ctx context.Context) (LimitRow, error) {
	o := e.o.Commits
	row := LimitRow{Name: fmt.Sprintf("%s, %d connections", limitCommits, o.Conns), Round: 1, LoadBefore: readLoad()}
	dsn, err := e.bucketDatabase(ctx, 1)
	if err != nil {
		return row, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return row, err
	}
	cfg.MinConns, cfg.MaxConns = int32(o.Conns), int32(o.Conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return row, err
	}
	defer pool.Close()
	// Every connection open, and the statement prepared on it, before the clock starts.
	conns := make([]*pgxpool.Conn, o.Conns)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			return row, err
		}
		defer conns[i].Release()
	}
	const insert = `INSERT INTO bucket_orders (token, sku, user_id, bucket, qty, expires_at) VALUES ($1, $2, $3, $4, 1, $5)`
	exp := time.Now().Add(reservationTT)
	logf("limits: %s for %s (load %s)", row.Name, o.Duration, row.LoadBefore)
	var n, errs atomic.Int64
	var firstErr atomic.Value
	rctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	pg0, t0 := e.postgresCPU(ctx), time.Now()
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; rctx.Err() == nil; j++ {
				if n.Load() >= o.MaxTx {
					return
				}
				id := fmt.Sprintf("%021d%022d", i, j)
				if _, err := c.Exec(rctx, insert, id, benchSKU, "commit-buyer-"+id, int32(i), exp); err != nil {
					if rctx.Err() == nil {
						errs.Add(1)
						firstErr.CompareAndSwap(nil, err)
					}
					continue
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	row.Calls = n.Load()
	if errs.Load() > 0 {
		return row, fmt.Errorf("%s: %d commits failed, first: %v", row.Name, errs.Load(), firstErr.Load())
	}
	if row.Calls == 0 {
		return row, fmt.Errorf("%s: no commit in %s", row.Name, elapsed)
	}
	row.PerSecond = float64(row.Calls) / elapsed.Seconds()
	row.ServerCPUus = float64((e.postgresCPU(ctx) - pg0).Microseconds()) / float64(row.Calls)
	logf("limits: %.0f one-row commits/s, %.1f µs PostgreSQL CPU per commit", row.PerSecond, row.ServerCPUus)
	return row, nil
}
