// Command bench measures, in one run on this machine, the reservation path of
// flashsale-operator against its references and prints a markdown table (or
// JSON with --json):
//
//   - storms against one `flashsale reserve` process (exec'd, configured by
//     the FLASHSALE_* environment) with an allocation no storm can exhaust, so
//     every answer is a reservation;
//   - the same storms, taking turns with it in every round, against the
//     references behind the same route (hack/bench/bare): the bare handler
//     (one call of the same reserve script and nothing else), HTTP plus a
//     one-command script (DECR), and the PostgreSQL bucket design (N bucket
//     rows per SKU, a conditional decrement on a random bucket with up to two
//     others tried, the order row inserted in the same transaction) for each
//     --buckets N;
//   - a sold-out storm against reserve and the bare handler;
//   - PostgreSQL hot-row baselines on a one-row inventory table;
//   - the physical limits (limits.go): redis-benchmark of reserve.lua and of
//     a one-command script, and PostgreSQL COPY of order rows;
//   - the Go benchmarks of the engine and the ledger.
//
// It starts its own redis-server and PostgreSQL (internal/testharness) on
// 127.0.0.1 and stops everything it started. docs/benchmarks.md has results.
//
//	go run ./hack/bench                 # the whole run, markdown on stdout
//	go run ./hack/bench --json          # the same as JSON
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

type options struct {
	Duration          time.Duration
	Warmup            time.Duration
	Concurrency       []int
	Rounds            int
	Allocation        int64
	Shards            int
	SoldOutAllocation int64
	SoldOutDuration   time.Duration
	MaxRequests       int
	HotRowDuration    time.Duration
	HotRowClients     []int
	HotRowMaxTx       int64
	GoBench           bool
	GoBenchTime       string
	Flashsale         string
	Profile           string
	ProfileSeconds    int
	ProfileStorm      string
	Perf              string
	JSON              bool
	JSONFile          string
	PostgresDSN       string
	Durable           bool
	Checkpoint        bool
	Skip              []string
	Targets           []string
	Buckets           []int
	Limits            LimitOptions
	Commits           CommitOptions
	OpenLoop          []float64
	OpenLoopRounds    int
	ReservePipeline   int
	ReservePipelines  []int
	ReserveLingers    []time.Duration
	// FlashsaleB is the second reserve binary of the reserve-b target.
	FlashsaleB string
}

// benchPostgresSettings configure the started PostgreSQL as a small
// production server would be, not as the test suite's (32 MB of shared
// buffers). backend_flush_after starts the writeback of the data pages a
// backend writes at once: otherwise the kernel writes hundreds of MB of them
// 30 s later in one burst, and the WAL flush of the commit behind it waits
// for the disk for 50-110 ms (docs/capacity-runs.md, "A quiet host").
var benchPostgresSettings = []string{"shared_buffers=512MB", "max_wal_size=4GB", "backend_flush_after=256kB"}

func main() {
	var o options
	fs := pflag.NewFlagSet("bench", pflag.ExitOnError)
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "length of each measured reservation storm")
	fs.IntVar(&o.Rounds, "rounds", 3, "times the reservation storms are repeated, reserve and bare handler taking turns; the ratios use the medians")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "unmeasured load before each measured run (connections, script cache, pools)")
	fs.IntSliceVar(&o.Concurrency, "concurrency", []int{64, 256}, "concurrent buyers of the reservation storms (the targets are read at 64 and 256)")
	fs.Int64Var(&o.Allocation, "allocation", 100_000_000, "units of the reservation campaigns: more than any storm can take, so every answer is a reservation")
	fs.IntVar(&o.Shards, "shards", 10, "stock shards of every campaign")
	fs.Int64Var(&o.SoldOutAllocation, "soldout-allocation", 1000, "units of the sold-out campaigns")
	fs.DurationVar(&o.SoldOutDuration, "soldout-duration", 10*time.Second, "length of each sold-out storm")
	fs.IntVar(&o.MaxRequests, "max-requests", 5_000_000, "upper bound on the requests of one storm, besides its duration")
	fs.DurationVar(&o.HotRowDuration, "hotrow-duration", 10*time.Second, "length of each PostgreSQL hot-row run")
	fs.IntSliceVar(&o.HotRowClients, "hotrow-clients", []int{64, 256}, "client connections of the hot-row runs")
	fs.Int64Var(&o.HotRowMaxTx, "hotrow-max-tx", 5_000_000, "upper bound on the transactions of one hot-row run, besides its duration")
	fs.BoolVar(&o.GoBench, "gobench", true, "also run the Go benchmarks of runtime/engine and runtime/ledger")
	fs.StringVar(&o.GoBenchTime, "gobench-time", "3s", "-benchtime of the Go benchmarks")
	fs.StringVar(&o.Flashsale, "flashsale", "", "flashsale binary to exec (default: bin/flashsale, built when missing or older than the sources)")
	fs.StringVar(&o.Profile, "profile", "", "write a CPU profile of the reserve process, taken during its first measured storm, to this file (the reserve process then runs with --debug-listen)")
	fs.StringVar(&o.Perf, "perf", "", "record the reserve process with perf record -g during its first measured storm into this file, with a flashsale built with symbols (the profiler's overhead is in that run's figures)")
	fs.IntVar(&o.ProfileSeconds, "profile-seconds", 10, "length of the CPU profile (--profile, --perf)")
	fs.StringVar(&o.ProfileStorm, "profile-storm", kindReservations, "which storm of the reserve process --profile and --perf take: its first closed-loop storm ("+kindReservations+") or its first on a schedule ("+kindOpenLoop+")")
	fs.BoolVar(&o.JSON, "json", false, "print the results as JSON instead of markdown")
	fs.StringVar(&o.JSONFile, "json-file", "", "also write the results as JSON to this file")
	fs.StringVar(&o.PostgresDSN, "postgres-dsn", "", "use this PostgreSQL (a postgres:// URL of a role that may create databases; on 127.0.0.1, allowing 300 connections) instead of starting one; the run's databases are dropped at the end")
	fs.BoolVar(&o.Durable, "durable", true, "run the started PostgreSQL with fsync on, as production does (the ledger's group commit and the hot-row baselines both pay for durability); --durable=false measures without it")
	fs.BoolVar(&o.Checkpoint, "checkpoint", false, "run CHECKPOINT in PostgreSQL between each storm's warm-up and its measured part, so that every measured storm starts where a checkpoint has just ended and pays for the full-page writes that follow one, instead of whichever storm a checkpoint lands in (needs a superuser or pg_checkpoint with --postgres-dsn)")
	fs.StringSliceVar(&o.Skip, "skip", nil, "parts to leave out: storm, soldout, hotrow, limits, commits (the one-row commit run of the limits), openloop (gobench has its own flag)")
	fs.StringSliceVar(&o.Targets, "targets", []string{targetReserve, targetBare, targetDecr, "pg-buckets"}, "targets of the reservation storms, taking turns in each round: reserve (the product's defaults), reserve-b (--flashsale-b), reserve-pipe (reserve calls pipelined as --reserve-pipeline says, one target per --reserve-pipelines and --reserve-linger), reserve-direct (every reserve call alone), bare (pipelined as reserve), bare-direct (every call alone), decr, pg-buckets")
	fs.IntSliceVar(&o.Buckets, "buckets", []int{10, 64}, "bucket rows per SKU of the pg-buckets targets (the best is held against reserve)")
	fs.IntVar(&o.ReservePipeline, "reserve-pipeline", 32, "most reserve calls in one Redis pipeline of the reserve-pipe targets (FLASHSALE_RESERVE_PIPELINE); the reserve target runs with the product's defaults, reserve-direct with 0")
	fs.IntSliceVar(&o.ReservePipelines, "reserve-pipelines", []int{1}, "most reserve pipelines out to one Redis server at once (FLASHSALE_RESERVE_PIPELINES); one reserve-pipe target per value and linger, taking turns")
	fs.DurationSliceVar(&o.ReserveLingers, "reserve-linger", []time.Duration{0}, "how long a pipeline of the reserve-pipe targets waits for more calls (FLASHSALE_RESERVE_LINGER); one reserve-pipe target per value, taking turns")
	fs.StringVar(&o.FlashsaleB, "flashsale-b", "", "a second flashsale binary, run as the reserve-b target beside reserve (e.g. built with -pgo=off): the same storms, taking turns, paired ratios")
	o.Limits.addFlags(fs)
	o.Commits.addFlags(fs)
	fs.Float64SliceVar(&o.OpenLoop, "open-loop", []float64{0.5, 0.8}, "fractions of each target's closed-loop maximum at 64 buyers run open-loop (on a schedule, 64 connections) after the reservation storms")
	fs.IntVar(&o.OpenLoopRounds, "open-loop-rounds", 3, "times the open-loop storms are repeated, the targets taking turns; the p99s reported are the medians")
	_ = fs.Parse(os.Args[1:])
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}

	settings := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) { settings[f.Name] = f.Value.String() })

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	rep, err := run(ctx, &o, settings)
	stop()
	// Whatever happened, no server of ours outlives the run.
	if cerr := testharness.CloseAll(); cerr != nil {
		fmt.Fprintln(os.Stderr, "bench: closing servers:", cerr)
	}
	if rep != nil && o.JSONFile != "" {
		if b, jerr := json.MarshalIndent(rep, "", "  "); jerr != nil {
			fmt.Fprintln(os.Stderr, "bench:", jerr)
		} else if werr := os.WriteFile(o.JSONFile, append(b, '\n'), 0o644); werr != nil {
			fmt.Fprintln(os.Stderr, "bench:", werr)
		}
	}
	if rep != nil {
		if o.JSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rep)
		} else {
			rep.writeMarkdown(os.Stdout)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// maxBuyers bounds --concurrency: an overload storm, far beyond what two
// cores serve, within the file descriptors both ends of each buyer hold.
const maxBuyers = 4096

func (o *options) validate() error {
	switch {
	case o.Duration <= 0 || o.SoldOutDuration <= 0 || o.HotRowDuration <= 0 || o.Warmup < 0:
		return errors.New("durations must be positive")
	case len(o.Concurrency) == 0 || len(o.HotRowClients) == 0:
		return errors.New("--concurrency and --hotrow-clients need at least one value")
	case o.MaxRequests < 1 || o.HotRowMaxTx < 1:
		return errors.New("--max-requests and --hotrow-max-tx must be positive")
	case o.Shards < 1:
		return errors.New("--shards must be at least 1")
	case o.Rounds < 1 || o.OpenLoopRounds < 1:
		return errors.New("--rounds and --open-loop-rounds must be at least 1")
	case o.Limits.Rounds < 0 || o.Commits.Conns < 1 || o.Commits.Conns > 280 || o.Commits.Duration <= 0 || o.Commits.MaxTx < 1:
		return errors.New("--limits-rounds must not be negative, --limits-commit-conns within 1..280, --limits-commit-duration and --limits-commit-max-tx positive")
	case o.ReservePipeline < 2 || len(o.ReservePipelines) == 0 || slices.Min(o.ReservePipelines) < 1 || len(o.ReserveLingers) == 0 || slices.Min(o.ReserveLingers) < 0:
		return errors.New("--reserve-pipeline must be at least 2, --reserve-pipelines at least 1 and --reserve-linger one or more durations, none negative")
	case slices.Contains(o.Targets, targetReserveB) != (o.FlashsaleB != ""):
		return errors.New("the reserve-b target and --flashsale-b go together")
	case o.ProfileStorm != kindReservations && o.ProfileStorm != kindOpenLoop:
		return fmt.Errorf("--profile-storm %q: want %s or %s", o.ProfileStorm, kindReservations, kindOpenLoop)
	}
	return o.validateLists()
}

// validateLists checks the values of the list flags one by one.
func (o *options) validateLists() error {
	for _, c := range o.Concurrency {
		// Buyers hold no PostgreSQL connection of their own (the bucket
		// handler pools bucketConns); each holds a socket at both ends.
		if c < 1 || c > maxBuyers {
			return fmt.Errorf("--concurrency %d out of 1..%d", c, maxBuyers)
		}
	}
	for _, c := range o.HotRowClients {
		// A hot-row client holds a connection of the harness's PostgreSQL,
		// which allows 300; the ledger pools and the audit need a few.
		if c < 1 || c > 280 {
			return fmt.Errorf("--hotrow-clients %d out of 1..280", c)
		}
	}
	for _, s := range o.Skip {
		switch s {
		case "storm", "soldout", "hotrow", "limits", "commits", "openloop":
		default:
			return fmt.Errorf("--skip %q: want storm, soldout, hotrow, limits, commits or openloop", s)
		}
	}
	for _, t := range o.Targets {
		switch t {
		case targetReserve, targetReserveB, targetReservePipe, targetReserveDirect, targetBare, targetBareDirect, targetDecr, "pg-buckets":
		default:
			return fmt.Errorf("--targets %q: want reserve, reserve-b, reserve-pipe, reserve-direct, bare, bare-direct, decr or pg-buckets", t)
		}
	}
	schedules := map[string]float64{}
	for _, f := range o.OpenLoop {
		if !(f > 0 && f <= 2) {
			return fmt.Errorf("--open-loop %v out of (0, 2]", f)
		}
		// The report groups a schedule's rounds by its name.
		if g, ok := schedules[scheduleNote(f)]; ok {
			return fmt.Errorf("--open-loop %v and %v are both %q: give fractions a whole percent apart", g, f, scheduleNote(f))
		}
		schedules[scheduleNote(f)] = f
	}
	for _, n := range o.Buckets {
		if n < 1 || n > 100_000 {
			return fmt.Errorf("--buckets %d out of 1..100000", n)
		}
	}
	return nil
}

func (o *options) skips(part string) bool {
	for _, s := range o.Skip {
		if s == part {
			return true
		}
	}
	return false
}

// logf reports progress on stderr; stdout carries only the report.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, o *options, settings map[string]string) (*Report, error) {
	root := testharness.RepoRoot()
	rep := &Report{
		Started: time.Now().UTC(), Machine: readMachine(), Options: o, Settings: settings,
		Command: shellQuote(append([]string{"go", "run", "./hack/bench"}, os.Args[1:]...)),
	}
	rep.Load.Start = readLoad()
	logf("load at start: %s", rep.Load.Start)

	work, err := os.MkdirTemp("", "flashsale-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	needServers := !o.skips("storm") || !o.skips("soldout") || !o.skips("hotrow") || !o.skips("limits")
	if needServers {
		if err := runServers(ctx, o, root, work, rep); err != nil {
			rep.finish()
			return rep, err
		}
	}
	if o.GoBench {
		logf("go benchmarks (load %s)", readLoad())
		if err := runGoBenchmarks(ctx, root, o.GoBenchTime, rep); err != nil {
			rep.finish()
			return rep, err
		}
	}
	rep.finish()
	return rep, nil
}

// runServers is everything that needs Redis and PostgreSQL.
func runServers(ctx context.Context, o *options, root, work string, rep *Report) error {
	var flashsale, bare string
	var err error
	if !o.skips("storm") || !o.skips("soldout") {
		switch {
		case o.Perf != "" && o.Flashsale == "":
			// perf resolves symbols from the symbol table, which `make build` strips.
			flashsale = filepath.Join(work, "flashsale-symbols")
			logf("--perf: building flashsale with symbols")
			err = goBuildWith(ctx, root, flashsale, "./cmd/flashsale", "")
		default:
			flashsale, err = flashsaleBinary(ctx, root, o.Flashsale)
		}
		if err != nil {
			return err
		}
		if bare, err = buildBare(ctx, root, work); err != nil {
			return err
		}
	}
	logf("starting redis-server (and PostgreSQL unless --postgres-dsn)")
	rs, err := testharness.StartRedis()
	if err != nil {
		return err
	}
	defer rs.Close()
	var pg pgServer
	if o.PostgresDSN != "" {
		ext, err := newExternalPG(o.PostgresDSN)
		if err != nil {
			return err
		}
		defer func() {
			if err := ext.Close(); err != nil {
				logf("dropping the run's databases: %v", err)
			}
		}()
		pg = ext
	} else {
		settings := slices.Clone(benchPostgresSettings)
		if o.Durable {
			settings = append(settings, "fsync=on")
		}
		hpg, err := testharness.StartPostgresArgs(settings...)
		if err != nil {
			return err
		}
		defer hpg.Close()
		pg = hpg
	}
	env := &benchEnv{o: o, work: work, flashsale: flashsale, bare: bare, redis: rs, pg: pg, rep: rep}
	defer env.close()
	rep.Servers = serverVersions(ctx, rs, pg)

	if !o.skips("storm") {
		if err := env.reservationStorms(ctx); err != nil {
			return err
		}
	}
	if !o.skips("soldout") {
		if err := env.soldOutStorms(ctx); err != nil {
			return err
		}
	}
	if !o.skips("hotrow") {
		if err := env.hotRows(ctx); err != nil {
			return err
		}
	}
	if !o.skips("limits") {
		if err := env.limits(ctx); err != nil {
			return err
		}
	}
	return nil
}

// serverVersions names the Redis and PostgreSQL the run measured, with the
// harness settings that matter for the numbers.
func serverVersions(ctx context.Context, rs *testharness.Redis, pg pgServer) string {
	redisV, pgV := "?", "?"
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	if info, err := rdb.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				redisV = v
			}
		}
	}
	if conn, err := pgx.Connect(ctx, pg.AdminDSN()); err == nil {
		var v, fsync, sc string
		if conn.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit')").Scan(&v, &fsync, &sc) == nil {
			pgV = fmt.Sprintf("%s (fsync=%s, synchronous_commit=%s)", v, fsync, sc)
		}
		conn.Close(ctx)
	}
	return fmt.Sprintf("redis-server %s (no persistence), PostgreSQL %s", redisV, pgV)
}

// Load is /proc/loadavg's first three fields.
type Load [3]float64

func (l Load) String() string { return fmt.Sprintf("%.2f %.2f %.2f", l[0], l[1], l[2]) }

func readLoad() Load {
	var l Load
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}

// Machine is what the numbers were taken on.
type Machine struct {
	CPUs     int     `json:"cpus"`
	CPUModel string  `json:"cpu_model"`
	MemoryGB float64 `json:"memory_gb"`
	Kernel   string  `json:"kernel"`
	Go       string  `json:"go"`
}

func readMachine() Machine {
	m := Machine{CPUs: numCPU(), Go: goVersion()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.MemoryGB = float64(procKB(string(b), "MemTotal")) / (1 << 30)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// repoPath is a path under the repository root.
func repoPath(root string, elem ...string) string {
	return filepath.Join(append([]string{root}, elem...)...)
}
