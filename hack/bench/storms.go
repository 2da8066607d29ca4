package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
)

// Campaign settings shared by every storm. The TTL outlasts the run, so no
// reservation expires and no sweeper is needed.
const (
	benchSKU      = "itm-bench"
	maxPerUser    = 1
	stealProbes   = 2
	reservationTT = 10 * time.Minute
	grace         = 30 * time.Second
	// requestTimeout is the storm client's per-request timeout.
	requestTimeout = 10 * time.Second
	// auditTimeout bounds the ledger audit after a storm.
	auditTimeout = 2 * time.Minute
)

type benchEnv struct {
	o         *options
	work      string
	flashsale string
	debugAddr string // the reserve process's --debug-listen address, with --profile
	bare      string
	redis     *testharness.Redis
	pg        pgServer
	rep       *Report

	rdb        *redis.Client
	ledgerDSN  string
	ledger     *ledger.Ledger
	key        []byte
	listenFlag string
	profiled   bool
	postmaster int // pid, found on first use
	limitRuns  int // redis-benchmark runs so far (limits.go)
}

// campaign is one seeded FlashSale; the run keeps an engine on it for audits.
type campaign struct {
	name   string
	id     string
	alloc  int64
	engine *engine.Engine
	dsn    string // the bucket design's database (pg-buckets targets)
}

func (e *benchEnv) setup(ctx context.Context) error {
	if e.rdb != nil {
		return nil
	}
	e.rdb = redis.NewClient(&redis.Options{Addr: e.redis.Addr()})
	dsn, err := e.pg.NewDatabase()
	if err != nil {
		return err
	}
	e.ledgerDSN = dsn
	if e.ledger, err = ledger.Open(ctx, dsn); err != nil {
		return err
	}
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	e.key = []byte(hex.EncodeToString(k))
	e.listenFlag = detectListenFlag(ctx, e.flashsale)
	return nil
}

func (e *benchEnv) close() {
	if e.ledger != nil {
		e.ledger.Close()
	}
	if e.rdb != nil {
		_ = e.rdb.Close()
	}
}

// detectListenFlag finds how `flashsale reserve` takes its address besides
// FLASHSALE_LISTEN, which it is always given.
func detectListenFlag(ctx context.Context, bin string) string {
	out, _ := exec.CommandContext(ctx, bin, "reserve", "--help").CombinedOutput()
	for _, f := range []string{"--listen", "--addr", "--address", "--http-addr"} {
		if strings.Contains(string(out), f+" ") {
			return f
		}
	}
	return ""
}

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// newCampaign creates the ledger row and seeds the shards OPEN, as the
// controller would before the reserve pods start.
func (e *benchEnv) newCampaign(ctx context.Context, name string, alloc int64) (*campaign, error) {
	cfg := engine.Config{
		CampaignID: newUUID(), Namespace: "bench", Name: name, SKU: benchSKU, Allocation: alloc,
		Shards: e.o.Shards, MaxPerUser: maxPerUser, TTL: reservationTT, Grace: grace, StealProbes: stealProbes,
		IDSecret: config.DeriveIDSecret(e.key),
	}
	eng, err := engine.New(cfg, e.rdb, e.ledger, ledger.MaterializerConfig{})
	if err != nil {
		return nil, err
	}
	if _, err := eng.Seed(ctx, stock.StateOpen); err != nil {
		eng.Close()
		return nil, fmt.Errorf("seed %s: %w", name, err)
	}
	return &campaign{name: name, id: cfg.CampaignID, alloc: alloc, engine: eng}, nil
}

// env is the FLASHSALE_* configuration of the processes serving c, the same
// for `flashsale reserve` and the bare handler.
func (e *benchEnv) env(c *campaign) []string {
	return []string{
		config.EnvCampaignID + "=" + c.id,
		config.EnvNamespace + "=bench",
		config.EnvName + "=" + c.name,
		config.EnvSKU + "=" + benchSKU,
		config.EnvShards + "=" + strconv.Itoa(e.o.Shards),
		config.EnvMaxPerUser + "=" + strconv.Itoa(maxPerUser),
		config.EnvStealProbes + "=" + strconv.Itoa(stealProbes),
		config.EnvTTL + "=" + reservationTT.String(),
		config.EnvGracePeriod + "=" + grace.String(),
		config.EnvRedisMode + "=" + config.RedisStandalone,
		config.EnvRedisAddresses + "=" + e.redis.Addr(),
		config.EnvPostgresDSN + "=" + e.ledgerDSN,
		config.EnvAdmissionKey + "=" + string(e.key),
	}
}

// soldOutStorms: small allocations, taken during the warm-up, so the measured
// storm gets sold-out answers only.
func (e *benchEnv) soldOutStorms(ctx context.Context) error {
	if err := e.setup(ctx); err != nil {
		return err
	}
	conc := e.o.Concurrency[0]
	for _, t := range []string{targetReserve, targetBare} {
		c, err := e.newCampaign(ctx, "soldout-"+t, e.o.SoldOutAllocation)
		if err != nil {
			return err
		}
		defer c.engine.Close()
		row, err := e.storm(ctx, kindSoldOut, t, c, conc, 0, e.o.SoldOutDuration, 0)
		if err != nil {
			return err
		}
		e.rep.Storms = append(e.rep.Storms, row)
	}
	return nil
}

// StormRow is one measured storm.
type StormRow struct {
	Kind        string `json:"kind"`   // reservations | sold-out | open-loop
	Target      string `json:"target"` // reserve | bare | decr | pg-buckets-<N>
	Concurrency int    `json:"concurrency"`
	Round       int    `json:"round,omitempty"` // reservation and open-loop storms: 1..rounds
	// Rate is an open-loop storm's schedule, requests per second (0: closed).
	Rate     float64 `json:"rate,omitempty"`
	Seconds  float64 `json:"seconds"`
	Requests int64   `json:"requests"`
	// RequestsPerSecond counts every answer; ReservationsPerSecond only the
	// acknowledged reservations (201).
	RequestsPerSecond     float64                     `json:"requests_per_second"`
	ReservationsPerSecond float64                     `json:"reservations_per_second"`
	Latency               storm.LatencyMS             `json:"latency_ms"`
	Outcomes              map[string]int64            `json:"outcomes"`
	AllOutcomes           map[string]map[string]int64 `json:"all_outcomes,omitempty"`
	// CPU microseconds per request: the server process, redis-server and this
	// process (the storm client); on a small machine they share the cores.
	ServerCPUus   float64 `json:"server_cpu_us_per_request"`
	RedisCPUus    float64 `json:"redis_cpu_us_per_request"`
	PostgresCPUus float64 `json:"postgres_cpu_us_per_request"`
	ClientCPUus   float64 `json:"client_cpu_us_per_request"`
	// ServerPeakRSSMiB is the most memory the server process held, warm-up
	// and storm (a process per storm).
	ServerPeakRSSMiB float64 `json:"server_peak_rss_mib,omitempty"`
	LoadBefore       Load    `json:"load_before"`
	LoadAfter        Load    `json:"load_after"`
	// OthersCores is the CPU the rest of the machine used meanwhile, in cores.
	OthersCores float64 `json:"others_cpu_cores"`
	// Server is the reserve process's view from its /metrics (reserve only).
	Server *ServerMetrics `json:"server_metrics,omitempty"`
	// Audit of the ledger after a storm against `flashsale reserve`: every
	// acknowledged reservation has its row, nothing oversold.
	AuditOK       *bool    `json:"audit_ok,omitempty"`
	AuditFailures []string `json:"audit_failures,omitempty"`
	Note          string   `json:"note,omitempty"`
}

// storm runs one measured storm (after its warm-up). The label names the
// buyers too, so no storm replays another's requests.
//
// A positive rate makes the measured storm open-loop (storm.Config.Rate) at
// that many requests per second on conc connections; the warm-up is closed.
func (e *benchEnv) storm(ctx context.Context, kind, target string, c *campaign, conc, round int, dur time.Duration, rate float64) (StormRow, error) {
	label := fmt.Sprintf("%s-%s-%d", kind, target, conc)
	if rate > 0 {
		label += fmt.Sprintf("-rate%.0f", rate)
	}
	if round > 0 {
		label += fmt.Sprintf("-round%d", round)
	}
	srv, err := e.start(ctx, target, c, label, conc)
	if err != nil {
		return StormRow{}, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = srv.stop()
		}
	}()
	client := storm.NewClient(conc, requestTimeout)
	defer client.CloseIdleConnections()
	key := e.key
	cfg := storm.Config{
		URLs: []string{srv.url()}, SKU: benchSKU,
		Mint: func(sku, user string, ttl time.Duration, now time.Time) (string, error) {
			return admission.Mint(key, sku, user, ttl, now)
		},
		// Every journey is a new buyer (journey n is buyer n), so maxPerUser 1
		// never refuses one.
		Buyers:      1 << 40,
		Concurrency: conc,
		Count:       e.o.MaxRequests,
		RetryRatio:  0, CheckoutRatio: 0, CancelRatio: 0, AbandonRatio: 1,
		Quantity: 1, TokenTTL: storm.DefaultTokenTTL, Timeout: requestTimeout,
		// One attempt per request: a retried 503 would hide a failure.
		MaxAttempts: 1,
		Seed:        1,
		Client:      client,
	}
	if err := e.prepare(ctx, cfg, label); err != nil {
		return StormRow{}, err
	}
	cfg.Duration, cfg.UserPrefix, cfg.Rate = dur, label, rate

	row := StormRow{Kind: kind, Target: target, Concurrency: conc, Round: round, Rate: rate, LoadBefore: readLoad()}
	logf("%s: storm %s at %d buyers (load %s)", label, dur, conc, row.LoadBefore)
	var profErr error
	var profWG sync.WaitGroup
	if target == targetReserve && kind == e.o.ProfileStorm && (e.o.Profile != "" || e.o.Perf != "") && !e.profiled {
		e.profiled = true
		profWG.Add(1)
		go func() {
			defer profWG.Done()
			secs := min(e.o.ProfileSeconds, int(dur/time.Second)-2)
			if e.o.Perf != "" {
				profErr = e.perfRecord(ctx, srv, secs)
				e.rep.Notes = append(e.rep.Notes, fmt.Sprintf("the %s row ran under `perf record` (%s): its figures include the profiler's overhead", label, e.o.Perf))
			}
			if e.o.Profile != "" {
				if err := e.profile(ctx, secs); err != nil {
					profErr = errors.Join(profErr, err)
				}
			}
		}()
	}
	var metricsBefore map[string]float64
	if isReserve(target) {
		if metricsBefore, err = scrape(ctx, srv.url()+"/metrics"); err != nil {
			logf("%s: /metrics: %v", label, err)
		}
	}
	srvCPU, redisCPU, pgCPU, selfCPU0 := srv.cpuTime(), e.redisCPU(ctx), e.postgresCPU(ctx), cpustat.Self()
	busy, t0 := cpustat.MachineBusy(), time.Now()
	res, err := runWhole(ctx, cfg, label)
	if err != nil {
		return StormRow{}, err
	}
	srvCPU, redisCPU, pgCPU, selfCPU0 = srv.cpuTime()-srvCPU, e.redisCPU(ctx)-redisCPU, e.postgresCPU(ctx)-pgCPU, cpustat.Self()-selfCPU0
	row.OthersCores = othersCores(cpustat.MachineBusy()-busy, srvCPU+redisCPU+pgCPU+selfCPU0, time.Since(t0))
	if metricsBefore != nil {
		if after, err := scrape(ctx, srv.url()+"/metrics"); err == nil {
			row.Server = serverMetrics(metricsBefore, after)
		} else {
			logf("%s: /metrics: %v", label, err)
		}
	}
	row.LoadAfter = readLoad()
	profWG.Wait()
	if profErr != nil {
		logf("%s: profile: %v", label, profErr)
		e.rep.Notes = append(e.rep.Notes, "CPU profile of the reserve process: "+profErr.Error())
	}
	row.ServerPeakRSSMiB = float64(srv.peakRSS()) / (1 << 20)
	stopped = true
	if err := srv.stop(); err != nil {
		return StormRow{}, fmt.Errorf("%s: %w", label, err)
	}

	r := storm.NewReport(cfg, res, nil)
	row.Seconds = r.ElapsedSeconds
	row.Requests = r.Requests
	row.RequestsPerSecond = r.RequestsPerSecond
	row.ReservationsPerSecond = r.ReservationsPerSecond
	row.Latency = r.LatencyMS[storm.OpReserve]
	row.Outcomes = r.Outcomes[storm.OpReserve]
	if kind == kindReservations || kind == kindOpenLoop {
		// New reservations only: a replay (200) writes nothing to the ledger.
		row.ReservationsPerSecond = 0
		if r.ElapsedSeconds > 0 {
			row.ReservationsPerSecond = float64(row.Outcomes["201"]) / r.ElapsedSeconds
		}
		if n := row.Outcomes["201"]; n != r.Requests {
			e.rep.Notes = append(e.rep.Notes, fmt.Sprintf("%s: %d of %d answers were not new reservations (201): %v", label, r.Requests-n, r.Requests, row.Outcomes))
		}
	}
	if len(r.Outcomes) > 1 {
		row.AllOutcomes = r.Outcomes
	}
	if n := float64(r.Requests); n > 0 {
		row.ServerCPUus = float64(srvCPU.Microseconds()) / n
		row.RedisCPUus = float64(redisCPU.Microseconds()) / n
		row.PostgresCPUus = float64(pgCPU.Microseconds()) / n
		row.ClientCPUus = float64(selfCPU0.Microseconds()) / n
	}
	if isReserve(target) {
		actx, cancel := context.WithTimeout(ctx, auditTimeout)
		a, err := storm.RunAudit(actx, storm.EngineSource{Engine: c.engine, Ledger: e.ledger}, res, 0)
		cancel()
		if err != nil {
			return StormRow{}, fmt.Errorf("%s: audit: %w", label, err)
		}
		row.AuditOK, row.AuditFailures = &a.OK, a.Failures
	}
	logf("%s: %.0f req/s, %.0f reservations/s, p50 %.2f p99 %.2f max %.2f ms, server peak RSS %.0f MiB, outcomes %v",
		label, row.RequestsPerSecond, row.ReservationsPerSecond, row.Latency.P50, row.Latency.P99, row.Latency.Max, row.ServerPeakRSSMiB, row.Outcomes)
	return row, nil
}

// prepare runs what comes before a measured storm: its warm-up (closed,
// with buyers of its own) and, with --checkpoint, a CHECKPOINT.
func (e *benchEnv) prepare(ctx context.Context, cfg storm.Config, label string) error {
	if e.o.Warmup > 0 {
		cfg.Duration, cfg.UserPrefix = e.o.Warmup, label+"-warm"
		logf("%s: warm-up %s", label, e.o.Warmup)
		if _, err := storm.Run(ctx, cfg); err != nil {
			return err
		}
	}
	if e.o.Checkpoint {
		if err := e.checkpoint(ctx); err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
	}
	return nil
}

// checkpoint runs CHECKPOINT: the pages written since the last one are
// flushed, and the first change of every page after it is logged whole.
func (e *benchEnv) checkpoint(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, e.pg.AdminDSN())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("CHECKPOINT: %w", err)
	}
	return nil
}

// runWhole runs a storm to its end: an interrupted one, short and partly
// measured, is an error, not a row.
func runWhole(ctx context.Context, cfg storm.Config, label string) (*storm.Result, error) {
	res, err := storm.Run(ctx, cfg)
	if err == nil && res.Interrupted {
		err = fmt.Errorf("%s: interrupted", label)
	}
	return res, err
}

// perfRecord samples the reserve process (its pid only) with call graphs, a
// couple of seconds into the storm.
func (e *benchEnv) perfRecord(ctx context.Context, srv *server, seconds int) error {
	if seconds < 1 {
		return fmt.Errorf("the storm is too short for a profile")
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Second):
	}
	pctx, cancel := context.WithTimeout(ctx, time.Duration(seconds+30)*time.Second)
	defer cancel()
	out, err := exec.CommandContext(pctx, "perf", "record", "-F", "499", "-g", "-p", strconv.Itoa(srv.pid()),
		"-o", e.o.Perf, "--", "sleep", strconv.Itoa(seconds)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("perf record: %v\n%s", err, out)
	}
	logf("perf profile of the reserve process written to %s (perf report -i %s --no-children)", e.o.Perf, e.o.Perf)
	return nil
}

// profile takes a CPU profile of the reserve process through its
// /debug/pprof endpoint, a couple of seconds into the storm.
func (e *benchEnv) profile(ctx context.Context, seconds int) error {
	if seconds < 1 {
		return fmt.Errorf("the storm is too short for a profile")
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Second):
	}
	client := &http.Client{Timeout: time.Duration(seconds+30) * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", e.debugAddr, seconds))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /debug/pprof/profile answered %s", resp.Status)
	}
	f, err := os.Create(e.o.Profile)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	logf("CPU profile of the reserve process written to %s", e.o.Profile)
	return f.Close()
}
