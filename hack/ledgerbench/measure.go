package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// target is one ledger with the new sale in it: alone, or beside the old ones.
type target struct {
	name     string
	l        *ledger.Ledger
	campaign string
	shards   int
	orders   int64 // buyers u0… of the new sale loaded before the rounds
	extra    atomic.Int64
}

// sample is what one round measured on one target.
type sample struct {
	CountsMs        float64 `json:"counts_ms"`         // median CountsByShard
	RebuildReadMs   float64 `json:"rebuild_read_ms"`   // one ReadRebuild
	RebuildPending  int64   `json:"rebuild_pending"`   // pending orders it streamed
	RebuildHolders  int64   `json:"rebuild_holders"`   // buyers it streamed
	RequestOrderMs  float64 `json:"request_order_ms"`  // median GetRequestOrder
	OrderMs         float64 `json:"order_ms"`          // median GetOrder
	SweepMs         float64 `json:"sweep_ms"`          // median CancelExpired of one batch
	InsertRowsPerS  float64 `json:"insert_rows_per_s"` // group-commit writer
	InsertBatchRows float64 `json:"insert_batch_rows"`
	InsertBatchMs   float64 `json:"insert_batch_ms"`
	InsertPGCPUus   float64 `json:"insert_pg_cpu_us_per_row"`
	InsertWALBytes  float64 `json:"insert_wal_bytes_per_row"`
	Load            float64 `json:"load"` // 1-minute load average at the start
}

type roundCfg struct {
	counts, lookups, sweepBatch, sweeps, insertRows, submitters int
	pgPID                                                       int
	checkpoint                                                  bool
}

func median(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(d[len(d)/2].Microseconds()) / 1000
}

func loadAvg() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func (t *target) round(ctx context.Context, round int, c roundCfg) (sample, error) {
	s := sample{Load: loadAvg()}
	var err error
	if c.checkpoint {
		// The writer's worst case: every page it touches is its first since
		// the checkpoint, and is written whole to the WAL.
		if _, err := t.l.Pool().Exec(ctx, "CHECKPOINT"); err != nil {
			return s, err
		}
	}
	wal0, err := walLSN(ctx, t.l)
	if err != nil {
		return s, err
	}
	if s.InsertRowsPerS, s.InsertBatchRows, s.InsertBatchMs, s.InsertPGCPUus, err = t.insert(ctx, c); err != nil {
		return s, err
	}
	wal1, err := walLSN(ctx, t.l)
	if err != nil {
		return s, err
	}
	s.InsertWALBytes = float64(wal1-wal0) / float64(c.insertRows)
	var took []time.Duration
	for range c.counts {
		t0 := time.Now()
		if _, err := t.l.CountsByShard(ctx, t.campaign, t.shards); err != nil {
			return s, err
		}
		took = append(took, time.Since(t0))
	}
	s.CountsMs = median(took)

	t0 := time.Now()
	_, err = t.l.ReadRebuild(ctx, t.campaign, t.shards, ledger.RebuildReader{
		Pending: func(_ context.Context, o []ledger.Order) error { s.RebuildPending += int64(len(o)); return nil },
		Holders: func(_ context.Context, h []ledger.Holder) error { s.RebuildHolders += int64(len(h)); return nil },
	})
	if err != nil {
		return s, err
	}
	s.RebuildReadMs = float64(time.Since(t0).Microseconds()) / 1000

	rng := rand.New(rand.NewPCG(uint64(round), 7))
	var byKey, byID []time.Duration
	for range c.lookups {
		user := "u" + strconv.FormatInt(rng.Int64N(t.orders), 10)
		key := stock.ReservationKey(idSecret, t.campaign, user, "r")
		t0 := time.Now()
		o, err := t.l.GetRequestOrder(ctx, t.campaign, key)
		if err != nil {
			return s, err
		}
		byKey = append(byKey, time.Since(t0))
		t0 = time.Now()
		if _, err := t.l.GetOrder(ctx, t.campaign, o.ReservationID); err != nil {
			return s, err
		}
		byID = append(byID, time.Since(t0))
	}
	s.RequestOrderMs, s.OrderMs = median(byKey), median(byID)

	s.SweepMs, err = t.sweep(ctx, round, c)
	return s, err
}

// sweep writes sweeps×sweepBatch pending orders that expired an hour ago and
// times the sweeper's cancel of them, one batch of ids per call.
func (t *target) sweep(ctx context.Context, round int, c roundCfg) (float64, error) {
	n := int64(c.sweeps * c.sweepBatch)
	prefix := fmt.Sprintf("x%d-", round)
	pending := func(int64) ledger.Status { return ledger.StatusPending }
	if err := copyOrders(ctx, t.l, t.campaign, t.shards, 0, n, prefix, pending, time.Now().Add(-time.Hour)); err != nil {
		return 0, err
	}
	var took []time.Duration
	ids := make([]string, 0, c.sweepBatch)
	for i := int64(0); i < n; i += int64(c.sweepBatch) {
		ids = ids[:0]
		for j := i; j < i+int64(c.sweepBatch); j++ {
			ids = append(ids, orderRow(t.campaign, t.shards, prefix+strconv.FormatInt(j, 10), ledger.StatusPending, time.Time{})[0].(string))
		}
		t0 := time.Now()
		st, err := t.l.CancelExpired(ctx, t.campaign, ids, 0)
		if err != nil {
			return 0, err
		}
		took = append(took, time.Since(t0))
		for _, id := range ids {
			if st[id] != ledger.StatusCancelledBySweeper {
				return 0, fmt.Errorf("sweep: %s is %q after the cancel", id, st[id])
			}
		}
	}
	return median(took), nil
}

// insert has c.submitters buyers submit c.insertRows new pending orders
// through the group-commit writer (its defaults), as the reserve path does.
func (t *target) insert(ctx context.Context, c roundCfg) (rowsPerS, batchRows, batchMs, pgCPUus float64, err error) {
	var batches, rows atomic.Int64
	var batchNs atomic.Int64
	m := t.l.NewMaterializer(ledger.MaterializerConfig{OnBatch: func(size int, d time.Duration) {
		batches.Add(1)
		rows.Add(int64(size))
		batchNs.Add(int64(d))
	}})
	defer m.Close()
	base := t.orders + t.extra.Add(int64(c.insertRows)) - int64(c.insertRows)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, c.submitters)
	expires := time.Now().Add(time.Hour)
	pg0 := cpustat.TreeWithExited(c.pgPID)
	t0 := time.Now()
	for range c.submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(c.insertRows) {
					return
				}
				user := "u" + strconv.FormatInt(base+i, 10)
				shard := stock.HomeShard(user, t.shards)
				o := ledger.Order{
					ReservationID: stock.FormatID(shard, stock.ReservationKey(idSecret, t.campaign, user, "r")),
					CampaignID:    t.campaign, SKU: skuOf(t.campaign), UserID: user, Shard: shard,
					Quantity: 1, Epoch: 1, ExpiresAt: expires,
				}
				if err := m.Submit(ctx, o); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	pgCPU := cpustat.TreeWithExited(c.pgPID) - pg0
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, 0, 0, err
	}
	b := max(batches.Load(), 1)
	return float64(c.insertRows) / wall.Seconds(), float64(rows.Load()) / float64(b),
		float64(batchNs.Load()) / float64(b) / 1e6, float64(pgCPU.Microseconds()) / float64(c.insertRows), nil
}

// walLSN is PostgreSQL's current WAL position in bytes: the difference across
// a step is the WAL it wrote (every database of the server; the rounds run
// one at a time).
func walLSN(ctx context.Context, l *ledger.Ledger) (int64, error) {
	var n int64
	err := l.Pool().QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&n)
	return n, err
}
