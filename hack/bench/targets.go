package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale-dev/flashsale-operator/internal/cmd/reserve"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Targets of a storm. All serve the same route with the same body and
// answers and are driven by the same runtime/storm client; only what stands
// behind the route differs.
const (
	targetReserve = "reserve" // `flashsale reserve`: the product
	// targetReserveB is the product from a second binary (--flashsale-b):
	// two builds of the same code side by side, such as with and without PGO.
	targetReserveB = "reserve-b"
	// targetReservePipe is the product with its reserve calls batched into
	// Redis pipelines (--reserve-pipeline), one target per --reserve-linger
	// and --reserve-pipelines: "reserve-pipe-<linger>[-x<pipelines>]".
	targetReservePipe = "reserve-pipe"
	// targetReserveDirect is the product with every reserve call sent alone
	// (FLASHSALE_RESERVE_PIPELINE=0), as before pipelining was its default.
	targetReserveDirect = "reserve-direct"
	targetBare          = "bare" // the same reserve script, pipelined as reserve's, nothing else
	// targetBareDirect is the bare handler with every call sent alone, the
	// like-for-like reference of reserve-direct.
	targetBareDirect = "bare-direct"
	targetDecr       = "decr" // a one-command script (DECR)
	// targetBuckets is the PostgreSQL bucket design, "pg-buckets-<N>".
	targetBuckets = "pg-buckets-"
)

// isReserve: the target is the product, pipelined or not, from either binary.
func isReserve(target string) bool {
	_, _, pipe := pipeOf(target)
	return target == targetReserve || target == targetReserveB || target == targetReserveDirect || pipe
}

// pipeTarget names the pipelined product with a linger and a number of
// pipelines in flight ("-x<n>" when more than one).
func pipeTarget(linger time.Duration, inFlight int) string {
	name := targetReservePipe + "-" + linger.String()
	if inFlight > 1 {
		name += "-x" + strconv.Itoa(inFlight)
	}
	return name
}

// pipeOf is the linger and the pipelines in flight of a reserve-pipe target
// (ok false: not one).
func pipeOf(target string) (linger time.Duration, inFlight int, ok bool) {
	s, ok := strings.CutPrefix(target, targetReservePipe+"-")
	if !ok {
		return 0, 0, false
	}
	inFlight = 1
	if l, n, found := strings.Cut(s, "-x"); found {
		var err error
		if inFlight, err = strconv.Atoi(n); err != nil || inFlight < 1 {
			return 0, 0, false
		}
		s = l
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, 0, false
	}
	return d, inFlight, true
}

// bucketTarget names the bucket design with n rows per SKU.
func bucketTarget(n int) string { return targetBuckets + strconv.Itoa(n) }

// bucketsOf is N of a bucket target (0: not one).
func bucketsOf(target string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(target, targetBuckets))
	if err != nil || !strings.HasPrefix(target, targetBuckets) {
		return 0
	}
	return n
}

// targets are the reservation storms' targets in the order each round runs them.
func (o *options) targets() []string {
	var out []string
	for _, t := range o.Targets {
		switch t {
		case "pg-buckets":
			for _, n := range o.Buckets {
				out = append(out, bucketTarget(n))
			}
			continue
		case targetReservePipe:
			for _, n := range o.ReservePipelines {
				for _, d := range o.ReserveLingers {
					out = append(out, pipeTarget(d, n))
				}
			}
			continue
		}
		out = append(out, t)
	}
	return out
}

// bucketConns is the bucket handler's pool: one connection per buyer up to
// 128 (the harness's PostgreSQL allows 300, and more connections than
// buckets only queue on the row locks).
func bucketConns(conc int) int { return min(conc, 128) }

func (e *benchEnv) start(ctx context.Context, target string, c *campaign, label string, conc int) (*server, error) {
	switch {
	case isReserve(target):
		env := append(e.env(c), e.o.pipelineEnv(target)...)
		bin := e.flashsale
		if target == targetReserveB {
			bin = e.o.FlashsaleB
		}
		if target == targetReserve && e.o.Profile != "" {
			port, err := testharness.FreePort()
			if err != nil {
				return nil, err
			}
			e.debugAddr = fmt.Sprintf("127.0.0.1:%d", port)
			env = append(env, config.EnvDebugListen+"="+e.debugAddr)
		}
		return startServer(ctx, label, e.work, bin, []string{"reserve"}, e.listenFlag, env)
	case target == targetDecr:
		return startServer(ctx, label, e.work, e.bare, []string{"--backend=decr"}, "--listen", e.env(c))
	case bucketsOf(target) > 0:
		// exec takes the last of duplicate variables: the bucket database.
		env := append(e.env(c), config.EnvPostgresDSN+"="+c.dsn)
		args := []string{"--backend=pg-buckets", fmt.Sprintf("--buckets=%d", bucketsOf(target)),
			fmt.Sprintf("--probes=%d", stealProbes), fmt.Sprintf("--pg-conns=%d", bucketConns(conc))}
		return startServer(ctx, label, e.work, e.bare, args, "--listen", env)
	}
	return startServer(ctx, label, e.work, e.bare, nil, "--listen", append(e.env(c), e.o.pipelineEnv(target)...))
}

// pipelineEnv is the reserve pipeline settings of a target's process: a
// reserve-pipe target's own, none for the -direct targets, the product's
// defaults for the others. Always explicit, so a reserve-b binary with other
// defaults runs as set.
func (o *options) pipelineEnv(target string) []string {
	batch, linger, inFlight := reserve.DefaultReservePipeline, time.Duration(0), reserve.DefaultReservePipelines
	if d, n, ok := pipeOf(target); ok {
		batch, linger, inFlight = o.ReservePipeline, d, n
	} else if target == targetReserveDirect || target == targetBareDirect {
		batch, inFlight = 0, 1
	}
	return []string{config.EnvReservePipeline + "=" + strconv.Itoa(batch), config.EnvReserveLinger + "=" + linger.String(),
		config.EnvReservePipelines + "=" + strconv.Itoa(inFlight)}
}

// newTarget makes the campaign a target serves: a seeded FlashSale, plus the
// DECR counters or the bucket database of the references.
func (e *benchEnv) newTarget(ctx context.Context, target string) (*campaign, error) {
	c, err := e.newCampaign(ctx, "storm-"+target, e.o.Allocation)
	if err != nil {
		return nil, err
	}
	switch n := bucketsOf(target); {
	case target == targetDecr:
		for i := range e.o.Shards {
			if err := e.rdb.Set(ctx, decrKey(stock.ShardKeys(c.id, i)), e.o.Allocation, 0).Err(); err != nil {
				c.engine.Close()
				return nil, err
			}
		}
	case n > 0:
		if c.dsn, err = e.bucketDatabase(ctx, n); err != nil {
			c.engine.Close()
			return nil, err
		}
	}
	return c, nil
}

// decrKey is the counter the decr backend decrements (hack/bench/bare).
func decrKey(k stock.Keys) string { return k.Stock() + ":decr" }

// bucketSchema is hack/bench/bare's BucketSchema (a main package cannot be
// imported; the handler checks the seeded row count at start).
const bucketSchema = `CREATE TABLE bucket_stock (
  sku text NOT NULL, bucket int NOT NULL, available bigint NOT NULL,
  PRIMARY KEY (sku, bucket));
CREATE TABLE bucket_orders (
  token text PRIMARY KEY, sku text NOT NULL, user_id text NOT NULL,
  bucket int NOT NULL, qty int NOT NULL, status text NOT NULL DEFAULT 'PENDING',
  expires_at timestamptz NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`

// bucketDatabase is a new database with the allocation over n bucket rows.
func (e *benchEnv) bucketDatabase(ctx context.Context, n int) (string, error) {
	dsn, err := e.pg.NewDatabase()
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, bucketSchema); err != nil {
		return "", err
	}
	_, err = conn.Exec(ctx, `INSERT INTO bucket_stock SELECT $1, b, $2 FROM generate_series(0, $3 - 1) b`,
		benchSKU, e.o.Allocation/int64(n), n)
	return dsn, err
}

// turnOrder is the order in which targets run in a round: every other round
// in reverse, so that a target that always ran first (on a smaller keyspace,
// a cooler machine) does not carry that into every pair.
func turnOrder(targets []string, round int) []string {
	ts := slices.Clone(targets)
	if round%2 == 0 {
		slices.Reverse(ts)
	}
	return ts
}

// reservationStorms: every target at every concurrency, on campaigns no
// storm can sell out.
func (e *benchEnv) reservationStorms(ctx context.Context) error {
	if err := e.setup(ctx); err != nil {
		return err
	}
	camps := map[string]*campaign{}
	for _, t := range e.o.targets() {
		c, err := e.newTarget(ctx, t)
		if err != nil {
			return err
		}
		defer c.engine.Close()
		camps[t] = c
	}
	// Interleaved, and repeated: the machine's speed drifts by more than the
	// gap being measured, so the targets take turns and the ratios use medians.
	for round := 1; round <= e.o.Rounds; round++ {
		for _, conc := range e.o.Concurrency {
			for _, t := range turnOrder(e.o.targets(), round) {
				row, err := e.storm(ctx, kindReservations, t, camps[t], conc, round, e.o.Duration, 0)
				if err != nil {
					return err
				}
				e.rep.Storms = append(e.rep.Storms, row)
			}
		}
	}
	if !e.o.skips("openloop") {
		return e.openLoop(ctx, camps)
	}
	return nil
}
