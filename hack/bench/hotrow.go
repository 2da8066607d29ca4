package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
)

// The classic design the product replaces: one inventory row every buyer
// decrements. The row starts with more units than any run can take, so every
// transaction decrements (none is a sold-out no-op).
const (
	hotSKU         = "itm-hot"
	hotUnits       = 1_000_000_000_000
	sqlHotSchema   = `CREATE TABLE inventory (sku text PRIMARY KEY, available bigint NOT NULL)`
	sqlHotSeed     = `INSERT INTO inventory (sku, available) VALUES ($1, $2)`
	sqlHotUpdate   = `UPDATE inventory SET available = available - 1 WHERE sku = $1 AND available > 0`
	sqlHotSelect   = `SELECT available FROM inventory WHERE sku = $1 FOR UPDATE`
	sqlHotDecrease = `UPDATE inventory SET available = available - 1 WHERE sku = $1`
	hotTxTimeout   = 10 * time.Second
)

// Hot-row variants.
const (
	variantUpdate    = "update"     // one conditional UPDATE (autocommit)
	variantForUpdate = "for-update" // BEGIN; SELECT ... FOR UPDATE; UPDATE; COMMIT
)

// HotRowRow is one hot-row run.
type HotRowRow struct {
	Variant     string          `json:"variant"`
	Clients     int             `json:"clients"`
	Seconds     float64         `json:"seconds"`
	Tx          int64           `json:"tx"`
	TxPerSecond float64         `json:"tx_per_second"`
	Errors      int64           `json:"errors"`
	Latency     storm.LatencyMS `json:"latency_ms"`
	LoadBefore  Load            `json:"load_before"`
	LoadAfter   Load            `json:"load_after"`
	OthersCores float64         `json:"others_cpu_cores"`
}

func (e *benchEnv) hotRows(ctx context.Context) error {
	dsn, err := e.pg.NewDatabase()
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sqlHotSchema); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, sqlHotSeed, hotSKU, int64(hotUnits)); err != nil {
		return err
	}
	for _, clients := range e.o.HotRowClients {
		for _, v := range []string{variantUpdate, variantForUpdate} {
			// Each run starts from a vacuumed table, not from the dead tuples
			// the previous one left.
			if _, err := conn.Exec(ctx, "VACUUM inventory"); err != nil {
				return err
			}
			row, err := e.hotRow(ctx, dsn, v, clients)
			if err != nil {
				return err
			}
			e.rep.HotRow = append(e.rep.HotRow, row)
		}
	}
	return nil
}

func (e *benchEnv) hotRow(ctx context.Context, dsn, variant string, clients int) (HotRowRow, error) {
	label := fmt.Sprintf("hot-row-%s-%d", variant, clients)
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return HotRowRow{}, err
	}
	pc.MaxConns, pc.MinConns = int32(clients), int32(clients)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return HotRowRow{}, err
	}
	defer pool.Close()
	// Open every connection before measuring: a flash sale's pool is warm.
	conns := make([]*pgxpool.Conn, 0, clients)
	for range clients {
		c, err := pool.Acquire(ctx)
		if err != nil {
			for _, c := range conns {
				c.Release()
			}
			return HotRowRow{}, fmt.Errorf("%s: %w", label, err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}

	tx := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, hotTxTimeout)
		defer cancel()
		if variant == variantUpdate {
			_, err := pool.Exec(ctx, sqlHotUpdate, hotSKU)
			return err
		}
		return pgx.BeginFunc(ctx, pool, func(t pgx.Tx) error {
			var avail int64
			if err := t.QueryRow(ctx, sqlHotSelect, hotSKU).Scan(&avail); err != nil {
				return err
			}
			if avail <= 0 {
				return errors.New("hot row exhausted")
			}
			_, err := t.Exec(ctx, sqlHotDecrease, hotSKU)
			return err
		})
	}
	if e.o.Warmup > 0 {
		logf("%s: warm-up %s", label, e.o.Warmup)
		_ = loop(ctx, clients, e.o.Warmup, e.o.HotRowMaxTx, tx)
	}
	row := HotRowRow{Variant: variant, Clients: clients, LoadBefore: readLoad()}
	logf("%s: %s at %d clients (load %s)", label, e.o.HotRowDuration, clients, row.LoadBefore)
	pgCPU, self, busy, t0 := e.postgresCPU(ctx), cpustat.Self(), cpustat.MachineBusy(), time.Now()
	r := loop(ctx, clients, e.o.HotRowDuration, e.o.HotRowMaxTx, tx)
	ours := e.postgresCPU(ctx) - pgCPU + cpustat.Self() - self
	row.OthersCores = othersCores(cpustat.MachineBusy()-busy, ours, time.Since(t0))
	row.LoadAfter = readLoad()
	row.Seconds, row.Tx, row.Errors = r.elapsed.Seconds(), r.ok, r.errors
	if row.Seconds > 0 {
		row.TxPerSecond = float64(r.ok) / row.Seconds
	}
	row.Latency = summarize(r.latencies)
	if r.firstErr != nil {
		logf("%s: %d errors, first: %v", label, r.errors, r.firstErr)
	}
	logf("%s: %.0f tx/s, p50 %.2f p99 %.2f max %.2f ms", label, row.TxPerSecond, row.Latency.P50, row.Latency.P99, row.Latency.Max)
	return row, nil
}

type loopResult struct {
	elapsed   time.Duration
	ok        int64
	errors    int64
	firstErr  error
	latencies []time.Duration
}

// loop runs fn from n workers until dur has passed or maxOps were started,
// whichever comes first, and records the latency of each successful call.
func loop(ctx context.Context, n int, dur time.Duration, maxOps int64, fn func(context.Context) error) loopResult {
	var started, errs atomic.Int64
	var mu sync.Mutex
	var res loopResult
	lat := make([][]time.Duration, n)
	start := time.Now()
	deadline := start.Add(dur)
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(deadline) && started.Add(1) <= maxOps {
				t0 := time.Now()
				if err := fn(ctx); err != nil {
					errs.Add(1)
					mu.Lock()
					if res.firstErr == nil {
						res.firstErr = err
					}
					mu.Unlock()
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.errors = errs.Load()
	for _, l := range lat {
		res.latencies = append(res.latencies, l...)
	}
	res.ok = int64(len(res.latencies))
	return res
}

// summarize gives exact percentiles (nearest rank) of the recorded latencies.
func summarize(d []time.Duration) storm.LatencyMS {
	if len(d) == 0 {
		return storm.LatencyMS{}
	}
	slices.Sort(d)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(d))-1e-9)) - 1 // the rank ⌈p·n⌉, p·n's float error aside
		i = min(max(i, 0), len(d)-1)
		return ms(d[i])
	}
	return storm.LatencyMS{Count: int64(len(d)), P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: ms(d[len(d)-1])}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
