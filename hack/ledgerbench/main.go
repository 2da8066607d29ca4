// Command ledgerbench measures whether the orders of finished sales slow a
// new sale's ledger queries, and what an order costs in the ledger, and
// prints markdown (results in docs/rebuild-benchmarks.md):
//
//   - two databases on one PostgreSQL (fsync on): one holding only a new
//     sale, one holding the same new sale beside --old-campaigns completed
//     sales of --old-orders orders each (loaded with COPY; the counters'
//     trigger fires on COPY too, and the load checks them against the orders);
//   - in rounds that alternate between the two: the group-commit writer's
//     insert rate, the status counts (CountsByShard), the rebuild's read
//     (ReadRebuild), a request's and an order's lookup (GetRequestOrder,
//     GetOrder) and the sweeper's cancel of a batch of expired orders
//     (CancelExpired);
//   - the bytes per order, table and each index;
//   - the insert cost of migration 0002's partial indexes and counter
//     trigger, against copies of the orders table without them.
//
// It starts its own PostgreSQL on 127.0.0.1 and removes it, with its data,
// when it ends.
//
//	go run ./hack/ledgerbench --old-campaigns 10 --old-orders 1000000
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

type options struct {
	oldCampaigns, shards, rounds          int
	oldOrders, newOrders                  int64
	round                                 roundCfg
	triggerReps, triggerStmts, triggerRow int
	sharedBuffers, jsonFile               string
}

// report is everything one run measured.
type report struct {
	OldCampaigns int                 `json:"old_campaigns"`
	OldOrders    int64               `json:"old_orders_each"`
	NewOrders    int64               `json:"new_orders"`
	LoadSeconds  float64             `json:"old_load_s"`
	LoadPGCPU    float64             `json:"old_load_pg_cpu_s"`
	LoadWALBytes float64             `json:"old_load_wal_bytes_per_order"`
	CounterPairs int64               `json:"counters_checked"`
	Sizes        relSizes            `json:"sizes_with_old"`
	Rounds       map[string][]sample `json:"rounds"`
	Triggers     []triggerResult     `json:"triggers"`
	StartLoad    float64             `json:"load_start"`
	Plans        string              `json:"plans_beside_old"`
}

func main() {
	var o options
	fs := pflag.NewFlagSet("ledgerbench", pflag.ExitOnError)
	fs.IntVar(&o.oldCampaigns, "old-campaigns", 10, "completed sales beside the new one")
	fs.Int64Var(&o.oldOrders, "old-orders", 1_000_000, "orders of each completed sale (80% committed, 20% cancelled or abandoned)")
	fs.Int64Var(&o.newOrders, "new-orders", 200_000, "orders of the new sale before the rounds (half pending, half committed)")
	fs.IntVar(&o.shards, "shards", 10, "stock shards of every sale")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds, each measuring both ledgers in turn")
	fs.IntVar(&o.round.counts, "counts", 200, "status-count reads per round")
	fs.IntVar(&o.round.lookups, "lookups", 2000, "request and order lookups per round")
	fs.IntVar(&o.round.sweepBatch, "sweep-batch", 100, "expired orders per sweeper cancel")
	fs.IntVar(&o.round.sweeps, "sweeps", 20, "sweeper cancels per round")
	fs.IntVar(&o.round.insertRows, "insert-rows", 20000, "orders written through the group-commit writer per round")
	fs.BoolVar(&o.round.checkpoint, "checkpoint", false, "CHECKPOINT before each round's writer run (its WAL right after a checkpoint)")
	fs.IntVar(&o.round.submitters, "submitters", 256, "concurrent submitters of those orders")
	fs.IntVar(&o.triggerReps, "trigger-reps", 10, "rounds of the 0002 insert-cost comparison")
	fs.IntVar(&o.triggerStmts, "trigger-statements", 20, "insert statements per variant per round")
	fs.IntVar(&o.triggerRow, "trigger-batch", 256, "rows per insert statement (the writer's batch)")
	fs.StringVar(&o.sharedBuffers, "shared-buffers", "512MB", "PostgreSQL shared_buffers")
	fs.StringVar(&o.jsonFile, "json-file", "", "also write the results as JSON to this file")
	_ = fs.Parse(os.Args[1:])
	if err := validate(o); err != nil {
		fmt.Fprintln(os.Stderr, "ledgerbench:", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "ledgerbench:", err)
		os.Exit(1)
	}
}

func validate(o options) error {
	switch {
	case o.oldCampaigns < 0, o.oldOrders < 0:
		return fmt.Errorf("--old-campaigns and --old-orders must be >= 0")
	case o.newOrders < 2, o.shards < 1, o.rounds < 1:
		return fmt.Errorf("--new-orders must be >= 2, --shards and --rounds >= 1")
	case o.round.counts < 1, o.round.lookups < 1, o.round.sweepBatch < 1, o.round.sweeps < 1, o.round.insertRows < 1, o.round.submitters < 1:
		return fmt.Errorf("--counts, --lookups, --sweep-batch, --sweeps, --insert-rows and --submitters must be >= 1")
	case o.triggerReps < 1, o.triggerStmts < 1, o.triggerRow < 1:
		return fmt.Errorf("--trigger-reps, --trigger-statements and --trigger-batch must be >= 1")
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "ledgerbench %s (load %.2f): %s\n", time.Now().UTC().Format("15:04:05"), loadAvg(), fmt.Sprintf(format, args...))
}

func run(o options) error {
	ctx := context.Background()
	rep := report{OldCampaigns: o.oldCampaigns, OldOrders: o.oldOrders, NewOrders: o.newOrders, Rounds: map[string][]sample{}, StartLoad: loadAvg()}
	pg, err := testharness.StartPostgresArgs("fsync=on", "synchronous_commit=on", "shared_buffers="+o.sharedBuffers, "max_wal_size=4GB")
	if err != nil {
		return err
	}
	defer pg.Close()
	o.round.pgPID = pg.PID()

	// The new sale has one id in both databases, a UID as the API server mints.
	newSale := campaignUID()
	alone, err := openTarget(ctx, pg, "alone", newSale, o)
	if err != nil {
		return err
	}
	defer alone.l.Close()
	beside, err := openTarget(ctx, pg, "beside old sales", newSale, o)
	if err != nil {
		return err
	}
	defer beside.l.Close()

	// The old sales first, then the new one beside them, as in production.
	pg0, t0 := cpustat.TreeWithExited(pg.PID()), time.Now()
	wal0, err := walLSN(ctx, beside.l)
	if err != nil {
		return err
	}
	for c := range o.oldCampaigns {
		id := campaignUID()
		if err := newCampaign(ctx, beside.l, id, fmt.Sprintf("old-%02d", c), o.shards, o.oldOrders); err != nil {
			return err
		}
		if err := copyOrders(ctx, beside.l, id, o.shards, 0, o.oldOrders, "u", oldStatus, time.Now().Add(-24*time.Hour)); err != nil {
			return err
		}
		logf("old sale %d of %d: %d orders written", c+1, o.oldCampaigns, o.oldOrders)
	}
	rep.LoadSeconds, rep.LoadPGCPU = time.Since(t0).Seconds(), (cpustat.TreeWithExited(pg.PID()) - pg0).Seconds()
	wal1, err := walLSN(ctx, beside.l)
	if err != nil {
		return err
	}
	if n := int64(o.oldCampaigns) * o.oldOrders; n > 0 {
		rep.LoadWALBytes = float64(wal1-wal0) / float64(n)
	}
	for _, t := range []*target{alone, beside} {
		if err := t.fill(ctx); err != nil {
			return err
		}
	}
	if rep.CounterPairs, err = verifyCounters(ctx, beside.l); err != nil {
		return err
	}
	if _, err := verifyCounters(ctx, alone.l); err != nil {
		return err
	}
	logf("counters agree with the orders: %d (campaign, shard) pairs", rep.CounterPairs)
	if rep.Sizes, err = sizesOf(ctx, beside.l, "flashsale_orders"); err != nil {
		return err
	}

	for r := range o.rounds {
		order := []*target{alone, beside}
		if r%2 == 1 {
			order = []*target{beside, alone}
		}
		for _, t := range order {
			s, err := t.round(ctx, r, o.round)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", t.name, r+1, err)
			}
			rep.Rounds[t.name] = append(rep.Rounds[t.name], s)
			logf("round %d, %s: %+v", r+1, t.name, s)
		}
	}
	if _, err := verifyCounters(ctx, beside.l); err != nil {
		return err
	}
	if rep.Plans, err = explain(ctx, beside.l, beside.campaign, o.shards); err != nil {
		return err
	}

	logf("insert cost of 0002's indexes and trigger")
	if rep.Triggers, err = triggerCost(ctx, alone.l, pg.PID(), o.shards, o.triggerReps, o.triggerStmts, o.triggerRow); err != nil {
		return err
	}
	printReport(rep)
	if o.jsonFile != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(o.jsonFile, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func openTarget(ctx context.Context, pg *testharness.Postgres, name, campaign string, o options) (*target, error) {
	dsn, err := pg.NewDatabase()
	if err != nil {
		return nil, err
	}
	l, err := ledger.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	return &target{name: name, l: l, campaign: campaign, shards: o.shards, orders: o.newOrders}, nil
}

// fill loads the new sale: half its buyers hold a pending order, half paid.
func (t *target) fill(ctx context.Context) error {
	if err := newCampaign(ctx, t.l, t.campaign, "new-sale", t.shards, 1_000_000_000); err != nil {
		return err
	}
	status := func(i int64) ledger.Status {
		if i%2 == 0 {
			return ledger.StatusCommitted
		}
		return ledger.StatusPending
	}
	if err := copyOrders(ctx, t.l, t.campaign, t.shards, 0, t.orders, "u", status, time.Now().Add(time.Hour)); err != nil {
		return err
	}
	_, err := t.l.Pool().Exec(ctx, "VACUUM ANALYZE")
	logf("%s: new sale of %d orders written", t.name, t.orders)
	return err
}
