// Command rebuildbench measures a rebuild from the ledger after Redis lost a
// sale's data, at several sale sizes, and prints a markdown table (results in
// docs/rebuild-benchmarks.md):
//
//   - wall time from the loss to the shards open, the orders restored;
//   - the peak RSS of the process that rebuilds (a child process running the
//     engine's Rebuild with the manager's ledger pool, as the manager does);
//   - PostgreSQL's and Redis's CPU time during the rebuild;
//   - the median cost of one status refresh (engine.Counts) afterwards;
//   - the ledger's bytes per order;
//   - a small sale rebuilt beside the largest one, to show that other sales'
//     orders do not slow a sale's own queries.
//
// Half of each sale's orders are committed and half pending, one buyer per
// order; the pending ones expire over the last TTL (10 minutes) of the
// hour to come, in the order they were written, as a sale's reservations do.
// It starts its own PostgreSQL (fsync on) and redis-server on 127.0.0.1
// and stops them. --redis-cluster puts the shards on a Redis Cluster of
// three masters instead of one standalone server, so that Redis's share of
// the rebuild is spread over several processes (and cores).
//
//	go run ./hack/rebuildbench --orders 100000,1000000,10000000
//
// --cpuprofile FILE writes the rebuilding child's CPU profile (go tool pprof),
// one file per sale size (FILE.<orders>).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// managerLedgerConns is the manager's ledger pool per sale (controllers).
const managerLedgerConns = 4

var idSecret = []byte("rebuild-benchmark-id-secret-32by")

type result struct {
	Orders      int64   `json:"orders"`
	Beside      int64   `json:"beside,omitempty"` // orders of another sale in the same ledger
	Seconds     float64 `json:"seconds"`
	Restored    int64   `json:"restored"`
	Holders     int64   `json:"holders"`
	StartRSSMiB float64 `json:"start_rss_mib"` // connected, before the rebuild
	PeakRSSMiB  float64 `json:"peak_rss_mib"`
	PostgresCPU float64 `json:"postgres_cpu_s"`
	RedisCPU    float64 `json:"redis_cpu_s"`
	// RedisCPUByServer is each server's share of RedisCPU (one entry unless
	// the shards are on a Cluster).
	RedisCPUByServer []float64 `json:"redis_cpu_by_server_s,omitempty"`
	RebuilderCPU     float64   `json:"rebuilder_cpu_s"`
	CountsMillis     float64   `json:"counts_ms"`
	BytesPerOrder    float64   `json:"bytes_per_order,omitempty"`
	// RedisCommands is Redis's time per command during the rebuild, seconds.
	RedisCommands map[string]float64 `json:"redis_commands,omitempty"`
}

func main() {
	var orders []int
	var shards int
	var child, cpuProfile string
	var cluster bool
	fs := pflag.NewFlagSet("rebuildbench", pflag.ExitOnError)
	fs.IntSliceVar(&orders, "orders", []int{100_000, 1_000_000, 10_000_000}, "sale sizes (acknowledged reservations) to rebuild")
	fs.IntVar(&shards, "shards", 10, "stock shards of each sale")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write the rebuilding child's CPU profile to this file, suffixed .<orders>")
	fs.BoolVar(&cluster, "redis-cluster", false, "a Redis Cluster of three masters instead of one standalone redis-server")
	fs.StringVar(&child, "child", "", "internal: rebuild the sale described by this JSON and report")
	_ = fs.Parse(os.Args[1:])
	if child != "" {
		if err := runChild(child, cpuProfile); err != nil {
			fmt.Fprintln(os.Stderr, "rebuildbench child:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(orders, shards, cluster, cpuProfile); err != nil {
		fmt.Fprintln(os.Stderr, "rebuildbench:", err)
		os.Exit(1)
	}
}

func run(sizes []int, shards int, cluster bool, cpuProfile string) error {
	ctx := context.Background()
	pg, err := testharness.StartPostgresArgs("fsync=on", "synchronous_commit=on", "shared_buffers=512MB", "max_wal_size=4GB")
	if err != nil {
		return err
	}
	defer pg.Close()
	rs, err := startRedis(cluster)
	if err != nil {
		return err
	}
	defer func() { _ = rs.close() }()
	var results []result
	slices.Sort(sizes)
	var last sale
	for i, n := range sizes {
		dsn, err := pg.NewDatabase()
		if err != nil {
			return err
		}
		s, err := newSale(ctx, dsn, rs, shards, int64(n))
		if err != nil {
			return err
		}
		r, err := measure(ctx, pg, rs, s, cpuProfile)
		if err != nil {
			return err
		}
		r.BytesPerOrder = s.bytesPerOrder(ctx)
		results = append(results, r)
		fmt.Fprintf(os.Stderr, "rebuildbench: %d orders: %.2fs, peak RSS %.0f MiB; Redis CPU seconds by server %.2f; Redis seconds by command %v\n", n, r.Seconds, r.PeakRSSMiB, r.RedisCPUByServer, r.RedisCommands)
		if i == len(sizes)-1 && i > 0 {
			last = s
		}
	}
	// The smallest sale again, in the ledger of the largest.
	if last.dsn != "" {
		s, err := newSale(ctx, last.dsn, rs, shards, int64(sizes[0]))
		if err != nil {
			return err
		}
		r, err := measure(ctx, pg, rs, s, "")
		if err != nil {
			return err
		}
		r.Beside = last.orders
		results = append(results, r)
	}
	printTable(results)
	return nil
}

// sale is one campaign filled with orders.
type sale struct {
	dsn    string
	redis  redisServers
	cfg    engine.Config
	orders int64
}

func newSale(ctx context.Context, dsn string, rs redisServers, shards int, n int64) (sale, error) {
	// A UID as the API server mints (36 characters): it leads every index of
	// the orders, so a shorter id would make them smaller than production's.
	id, name := string(uuid.NewUUID()), fmt.Sprintf("bench-%d", n)
	cfg := engine.Config{
		CampaignID: id, Namespace: "bench", Name: name, SKU: "sku-" + id[:8], Allocation: n + n/10,
		Shards: shards, MaxPerUser: 1, TTL: 10 * time.Minute, Grace: 30 * time.Second, IDSecret: idSecret,
	}
	s := sale{dsn: dsn, redis: rs, cfg: cfg, orders: n}
	l, err := ledger.Open(ctx, dsn)
	if err != nil {
		return s, err
	}
	defer l.Close()
	rdb := rs.client()
	defer rdb.Close()
	e, err := engine.New(cfg, rdb, l, ledger.MaterializerConfig{})
	if err != nil {
		return s, err
	}
	defer e.Close()
	if _, err := e.Seed(ctx, stock.StateOpen); err != nil {
		return s, err
	}
	start := time.Now()
	if err := fillOrders(ctx, l, cfg, n); err != nil {
		return s, err
	}
	fmt.Fprintf(os.Stderr, "rebuildbench: %d orders written in %s\n", n, time.Since(start).Round(time.Second))
	return s, nil
}

// fillOrders writes n orders with COPY, a million per statement: even ones
// committed, odd ones pending, each on its buyer's home shard. Order i
// expires at last − (n−i)/n × TTL: a sale's reservations expire in the order
// they were made, a few per millisecond at most, and the rebuild's expiry
// index is built from those scores. (All at one instant, the index would cost
// Redis a string comparison at every step of every insertion.)
func fillOrders(ctx context.Context, l *ledger.Ledger, cfg engine.Config, n int64) error {
	cols := []string{"reservation_id", "campaign_id", "sku", "user_id", "shard", "quantity", "status", "epoch", "expires_at", "payment_token", "request_key"}
	last := time.Now().Add(time.Hour)
	const chunk = 1_000_000
	for from := int64(0); from < n; from += chunk {
		to := min(n, from+chunk)
		i := from
		src := pgx.CopyFromFunc(func() ([]any, error) {
			if i >= to {
				return nil, nil
			}
			user := "u" + strconv.FormatInt(i, 10)
			shard := stock.HomeShard(user, cfg.Shards)
			key := stock.ReservationKey(cfg.IDSecret, cfg.CampaignID, user, "r")
			id := stock.FormatID(shard, key)
			expires := last.Add(-time.Duration(float64(cfg.TTL) * float64(n-i) / float64(n)))
			row := []any{id, cfg.CampaignID, cfg.SKU, user, int32(shard), int32(1), "PENDING", int64(1), expires, nil, key}
			if i%2 == 0 {
				row[6], row[9] = "COMMITTED", "pay-"+user
			}
			i++
			return row, nil
		})
		if _, err := l.Pool().CopyFrom(ctx, pgx.Identifier{"flashsale_orders"}, cols, src); err != nil {
			return err
		}
	}
	_, err := l.Pool().Exec(ctx, "VACUUM ANALYZE flashsale_orders")
	return err
}

func (s sale) bytesPerOrder(ctx context.Context) float64 {
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return 0
	}
	defer conn.Close(ctx)
	var size, rows int64
	if err := conn.QueryRow(ctx, `SELECT pg_total_relation_size('flashsale_orders'), (SELECT count(*) FROM flashsale_orders)`).Scan(&size, &rows); err != nil || rows == 0 {
		return 0
	}
	return float64(size) / float64(rows)
}

// measure loses the sale's Redis data and has a child process rebuild it.
func measure(ctx context.Context, pg *testharness.Postgres, rs redisServers, s sale, cpuProfile string) (result, error) {
	if err := rs.flush(ctx); err != nil {
		return result{}, err
	}
	arg, _ := json.Marshal(childArgs{DSN: s.dsn, Redis: rs.Addrs, Cluster: rs.Cluster, Config: s.cfg})
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	statsBefore := rs.commandStats(ctx)
	pgCPU, redisCPU := cpustat.TreeWithExited(pg.PID()), rs.cpuByServer()
	var out, errb bytes.Buffer
	args := []string{"--child", string(arg)}
	if cpuProfile != "" {
		args = append(args, "--cpuprofile", cpuProfile+"."+strconv.FormatInt(s.orders, 10))
	}
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Stdout, cmd.Stderr = &out, io.MultiWriter(&errb, os.Stderr)
	if err := cmd.Run(); err != nil {
		return result{}, fmt.Errorf("child: %w: %s", err, errb.String())
	}
	var r result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return result{}, fmt.Errorf("child said %q: %w", out.String(), err)
	}
	r.Orders = s.orders
	r.PostgresCPU = (cpustat.TreeWithExited(pg.PID()) - pgCPU).Seconds()
	for i, d := range rs.cpuByServer() {
		r.RedisCPUByServer = append(r.RedisCPUByServer, (d - redisCPU[i]).Seconds())
		r.RedisCPU += r.RedisCPUByServer[i]
	}
	r.RedisCommands = diffStats(statsBefore, rs.commandStats(ctx))
	return r, nil
}

// diffStats is after − before in seconds, for the commands that took any.
func diffStats(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := (v - before[k]) / 1e6; d >= 0.001 {
			out[k] = d
		}
	}
	return out
}

type childArgs struct {
	DSN     string
	Redis   []string
	Cluster bool
	Config  engine.Config
}

// runChild rebuilds as the manager does, then times status refreshes, and
// prints its result with its own peak RSS.
func runChild(arg, cpuProfile string) error {
	var a childArgs
	if err := json.Unmarshal([]byte(arg), &a); err != nil {
		return err
	}
	ctx := context.Background()
	l, err := ledger.Open(ctx, a.DSN, ledger.WithMaxConns(managerLedgerConns))
	if err != nil {
		return err
	}
	defer l.Close()
	rdb := redisServers{Addrs: a.Redis, Cluster: a.Cluster}.client()
	defer rdb.Close()
	e, err := engine.New(a.Config, rdb, l, ledger.MaterializerConfig{})
	if err != nil {
		return err
	}
	defer e.Close()
	if err := e.PingRedis(ctx); err != nil {
		return err
	}
	if err := l.Ping(ctx); err != nil {
		return err
	}
	startRSS := statusMiB("VmRSS:")
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	start := time.Now()
	rep, err := e.Rebuild(ctx, func() string { return stock.StateOpen })
	if cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return err
	}
	r := result{Seconds: time.Since(start).Seconds(), Restored: rep.Restored, Holders: rep.Holders, RebuilderCPU: cpustat.Self().Seconds(), StartRSSMiB: startRSS}
	var took []time.Duration
	for range 50 {
		t0 := time.Now()
		c, err := e.Counts(ctx)
		if err != nil {
			return err
		}
		took = append(took, time.Since(t0))
		if !c.Conserved() || c.Sold+c.Reserved+c.Available != a.Config.Allocation {
			return fmt.Errorf("not conserved after the rebuild: %+v", c)
		}
	}
	slices.Sort(took)
	r.CountsMillis = float64(took[len(took)/2].Microseconds()) / 1000
	r.PeakRSSMiB = peakRSSMiB()
	return json.NewEncoder(os.Stdout).Encode(r)
}

// peakRSSMiB is this process's VmHWM, statusMiB a field of its status in MiB.
func peakRSSMiB() float64 { return statusMiB("VmHWM:") }

func statusMiB(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func printTable(rs []result) {
	fmt.Println("| orders | beside | rebuild s | orders restored | buyers restored | RSS before / peak MiB | rebuilder CPU s | PostgreSQL CPU s | Redis CPU s | status refresh ms | ledger bytes/order |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		beside := "-"
		if r.Beside > 0 {
			beside = strconv.FormatInt(r.Beside, 10)
		}
		fmt.Printf("| %d | %s | %.2f | %d | %d | %.0f / %.0f | %.2f | %.2f | %.2f | %.3f | %.0f |\n",
			r.Orders, beside, r.Seconds, r.Restored, r.Holders, r.StartRSSMiB, r.PeakRSSMiB, r.RebuilderCPU, r.PostgresCPU, r.RedisCPU, r.CountsMillis, r.BytesPerOrder)
	}
}
