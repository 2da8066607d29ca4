/*
Copyright 2026 The flashsale-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// Package reserve is the `flashsale reserve` command: the reservation HTTP API of
// one FlashSale (runtime/api), configured by flags with environment defaults.
package reserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flashsale-dev/flashsale-operator/internal/version"
	"github.com/flashsale-dev/flashsale-operator/runtime/api"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Defaults of the rate limit: generous for a person, tight for a retry loop.
const (
	DefaultRateLimit = 10
	DefaultRateBurst = 20
)

// startupTimeout bounds connecting to (and migrating) the ledger at start; a pod
// that cannot reach it exits and is restarted with back-off.
const startupTimeout = config.StartupTimeout

// Options are the settings of `flashsale reserve`.
type Options struct {
	Campaign config.Campaign
	Listen   string
	LogLevel string
	Server   api.Config // the durations, sizes and rate limit; the rest is built by Run
	// Ledger tunes the group-commit writer of PENDING rows.
	Ledger ledger.MaterializerConfig
	// Pipeline batches the reserve script calls to one Redis server.
	Pipeline stock.PipelineConfig
	// GCPercent is the Go GC target (debug.SetGCPercent) unless GOGC is set.
	GCPercent int
	// MemoryLimit is the container's memory limit in bytes (0: none); the
	// Go runtime's is set to config.MemoryLimitShare of it unless GOMEMLIMIT is set.
	MemoryLimit uint64
	// DebugListen, when set, serves net/http/pprof there (keep it on loopback).
	DebugListen string
	// MetricsListen, when set, is where /metrics is served instead of the
	// API's listener.
	MetricsListen string
	// StealSeed seeds the draws of the shards a steal probes (engine.Config.Rand),
	// so that a storm replays by seed; 0: drawn at random.
	StealSeed uint64

	env config.EnvDefaults // malformed environment values, reported by Complete
}

// NewCmd returns the `reserve` command.
func NewCmd() *cobra.Command {
	var opts Options
	cmd := &cobra.Command{
		Use:   "reserve",
		Short: "Serve the reservation API of one FlashSale",
		Long: `Serves POST /api/v1/flash-sale/reserve, POST /api/v1/flash-sale/checkout,
DELETE /api/v1/flash-sale/reservations/{id}, GET /api/v1/flash-sale/reservations,
GET /api/v1/flash-sale/items/{sku}/availability,
/healthz, /readyz and /metrics for one FlashSale (see docs/api.md);
/metrics on its own address with --metrics-listen.

Every flag defaults to its environment variable. Secrets come only from the
environment or files: FLASHSALE_POSTGRES_DSN, FLASHSALE_ADMISSION_KEY,
FLASHSALE_ID_KEY and FLASHSALE_REDIS_PASSWORD, each also as <NAME>_FILE. The campaign must exist in the
ledger (the controller creates it); until then /readyz answers 503.
On SIGTERM or SIGINT in-flight requests finish, then the process exits 0.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.Complete(); err != nil {
				return err
			}
			log, err := config.NewLogger(cmd.ErrOrStderr(), opts.LogLevel)
			if err != nil {
				return err
			}
			config.RouteRedisLogs(config.SlogRedisSink(log))
			return Run(cmd.Context(), opts, log)
		},
	}
	opts.AddFlags(cmd.Flags())
	return cmd
}

// AddFlags registers the flags; their defaults come from the environment.
func (o *Options) AddFlags(f *pflag.FlagSet) {
	o.Campaign.AddFlags(f)
	s := &o.Server
	f.StringVar(&o.Listen, "listen", config.EnvString(config.EnvListen, config.DefaultListen), "address the API listens on (env "+config.EnvListen+")")
	f.Float64Var(&s.RateLimit, "rate-limit", o.env.Float(config.EnvRateLimit, DefaultRateLimit),
		"requests per second each buyer may send on the buyer routes, per replica; 0 disables the limit (env "+config.EnvRateLimit+")")
	f.IntVar(&s.RateBurst, "rate-burst", o.env.Int(config.EnvRateBurst, DefaultRateBurst), "requests a buyer may send at once (env "+config.EnvRateBurst+")")
	// The HTTP server's durations.
	for _, d := range []struct {
		v         *time.Duration
		flag, env string
		def       time.Duration
		usage     string
	}{
		{&s.RequestTimeout, "request-timeout", config.EnvRequestTimeout, api.DefaultRequestTimeout, "deadline of one request's wait for a place and its Redis and SQL work"},
		{&s.ReadHeaderTimeout, "read-header-timeout", config.EnvReadHeaderTimeout, api.DefaultReadHeaderTimeout, "time to read a request's headers"},
		{&s.ReadTimeout, "read-timeout", config.EnvReadTimeout, api.DefaultReadTimeout, "time to read a whole request, body included"},
		{&s.WriteTimeout, "write-timeout", config.EnvWriteTimeout, 0, "time to handle a request and write the answer; 0 means --request-timeout + 5s"},
		{&s.IdleTimeout, "idle-timeout", config.EnvIdleTimeout, api.DefaultIdleTimeout, "how long an idle keep-alive connection stays open"},
		{&s.AvailabilityCache, "availability-cache", config.EnvAvailabilityCache, api.DefaultAvailabilityCache, "how long one Redis read of the shards answers the availability route"},
		{&s.ShutdownTimeout, "shutdown-timeout", config.EnvShutdownTimeout, api.DefaultShutdownTimeout, "how long in-flight requests may take to finish after SIGTERM"},
		{&s.DrainDelay, "drain-delay", config.EnvDrainDelay, 0, "keep serving this long after SIGTERM with /readyz failing, before closing the listener"},
	} {
		f.DurationVar(d.v, d.flag, o.env.Duration(d.env, d.def), d.usage+" (env "+d.env+")")
	}
	f.Int64Var(&s.MaxBodyBytes, "max-body-bytes", int64(o.env.Int(config.EnvMaxBodyBytes, api.DefaultMaxBodyBytes)),
		"largest request body accepted (env "+config.EnvMaxBodyBytes+")")
	f.IntVar(&s.MaxInFlight, "max-in-flight", o.env.Int(config.EnvMaxInFlight, api.DefaultMaxInFlight),
		"most buyer requests (reserve, checkout, cancel, the list of reservations) taken in at once: up to "+strconv.Itoa(api.DefaultWorking)+" do their Redis and SQL work, the others wait in line for a place, at most half --request-timeout; one more, or one that waited that long, is answered 503 with Retry-After; 0 takes the default, -1 sets no bound (on the work either) (env "+config.EnvMaxInFlight+")")
	f.StringVar(&o.LogLevel, "log-level", config.EnvString(config.EnvLogLevel, "info"), "debug, info, warn or error (env "+config.EnvLogLevel+")")
	f.IntVar(&o.Ledger.Concurrency, "ledger-writers", o.env.Int(config.EnvLedgerWriters, DefaultLedgerWriters),
		"most ledger transactions in flight at once; one at a time while it keeps up (batches grow with load), another only when a full batch of 256 rows waits (env "+config.EnvLedgerWriters+")")
	f.DurationVar(&o.Ledger.MaxWait, "ledger-linger", o.env.Duration(config.EnvLedgerLinger, 0),
		"how long a ledger writer waits for more rows before writing a batch; 0 writes what is queued at once (env "+config.EnvLedgerLinger+")")
	f.IntVar(&o.Pipeline.MaxBatch, "reserve-pipeline", o.env.Int(config.EnvReservePipeline, DefaultReservePipeline),
		"most reserve script calls sent to one Redis server in one pipeline; calls arriving while one is in flight go in the next; 0 or 1 sends each call alone (env "+config.EnvReservePipeline+")")
	f.DurationVar(&o.Pipeline.Linger, "reserve-linger", o.env.Duration(config.EnvReserveLinger, 0),
		"how long a reserve pipeline waits for more calls before it is sent; 0 sends what is queued at once (env "+config.EnvReserveLinger+")")
	f.IntVar(&o.Pipeline.InFlight, "reserve-pipelines", o.env.Int(config.EnvReservePipelines, DefaultReservePipelines),
		"most reserve pipelines out to one Redis server at once before calls queue for the next (one more when a full one waits) (env "+config.EnvReservePipelines+")")
	f.StringVar(&o.MetricsListen, "metrics-listen", config.EnvString(config.EnvMetricsListen, ""),
		"serve /metrics on this address instead of the API's, e.g. :9090, so buyers cannot reach it (env "+config.EnvMetricsListen+")")
	f.StringVar(&o.DebugListen, "debug-listen", config.EnvString(config.EnvDebugListen, ""),
		"serve Go profiles (/debug/pprof/) on this address, e.g. 127.0.0.1:6060; off when empty; never expose it (env "+config.EnvDebugListen+")")
	f.Uint64Var(&o.StealSeed, "steal-seed", o.env.Uint64(config.EnvStealSeed, 0),
		"seed of the shards a steal probes, so that a storm against this process replays by seed (tests); 0 draws it at random (env "+config.EnvStealSeed+")")
	f.IntVar(&o.GCPercent, "gc-percent", o.env.Int(config.EnvGCPercent, DefaultGCPercent),
		"Go GC target: the process holds little memory, so collecting less often saves CPU on the hot path; GOGC, when set, wins (env "+config.EnvGCPercent+")")
	f.Uint64Var(&o.MemoryLimit, "memory-limit", o.env.Uint64(config.EnvMemoryLimit, 0),
		"the container's memory limit in bytes: the Go runtime collects harder as it nears 9/10 of it instead of being killed at it; 0: none; GOMEMLIMIT, when set, wins; the operator sets it from the pod's limits.memory (env "+config.EnvMemoryLimit+")")
}

// Defaults of the ledger writer and the GC.
const (
	DefaultLedgerWriters = 2
	DefaultGCPercent     = 400
	// DefaultReservePipeline and DefaultReservePipelines batch the reserve
	// calls to one Redis server into pipelines of up to 32, two out at once:
	// about a fifth less CPU per reservation in Redis and in this process,
	// and no worse a p99 (docs/capacity.md, "Pipelined reserve calls").
	DefaultReservePipeline  = 32
	DefaultReservePipelines = 2
)

// Complete reads the secrets and checks everything, naming what is wrong.
func (o *Options) Complete() error {
	errs := []error{o.env.Err()}
	errs = append(errs, o.Campaign.Complete())
	s := o.Server
	if s.RateLimit < 0 || s.RateBurst < 0 || math.IsNaN(s.RateLimit) || math.IsInf(s.RateLimit, 0) {
		errs = append(errs, fmt.Errorf("--rate-limit must be a finite number and --rate-burst a count, neither negative"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"request-timeout", s.RequestTimeout}, {"read-header-timeout", s.ReadHeaderTimeout},
		{"read-timeout", s.ReadTimeout}, {"write-timeout", s.WriteTimeout}, {"idle-timeout", s.IdleTimeout},
		{"availability-cache", s.AvailabilityCache}, {"shutdown-timeout", s.ShutdownTimeout}, {"drain-delay", s.DrainDelay},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("--%s must not be negative, got %s", d.name, d.v))
		}
	}
	if o.Ledger.Concurrency < 1 || o.Ledger.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("--ledger-writers must be at least 1 and --ledger-linger not negative"))
	}
	if err := o.Pipeline.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--reserve-pipeline, --reserve-linger and --reserve-pipelines must not be negative"))
	}
	if o.GCPercent < 10 {
		errs = append(errs, fmt.Errorf("--gc-percent must be at least 10, got %d", o.GCPercent))
	}
	if s.MaxInFlight < -1 {
		errs = append(errs, fmt.Errorf("--max-in-flight must be a count, or -1 for no bound, got %d", s.MaxInFlight))
	}
	if s.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("--max-body-bytes must not be negative"))
	}
	if _, err := config.ParseLogLevel(o.LogLevel); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Run serves until ctx is cancelled (SIGTERM or SIGINT), drains, and returns nil
// after a clean shutdown.
func Run(ctx context.Context, opts Options, log *slog.Logger) error {
	c := &opts.Campaign
	log = log.With("role", "reserve", "campaign", c.ID)
	redact := redactor(c)
	log.Info("starting", "version", version.Version, "commit", version.GitCommit,
		"namespace", c.Namespace, "name", c.Name, "sku", c.SKU, "shards", c.Shards,
		"maxPerUser", c.MaxPerUser, "stealProbes", c.StealProbes, "ttl", c.TTL.String(),
		"redisMode", c.Redis.Mode, "redisAddresses", c.Redis.Addresses, "listen", opts.Listen, "metricsListen", opts.MetricsListen,
		"rateLimit", opts.Server.RateLimit, "rateBurst", opts.Server.RateBurst,
		"reservePipeline", opts.Pipeline.MaxBatch, "reserveLinger", opts.Pipeline.Linger.String(), "reservePipelines", opts.Pipeline.InFlight, "stealSeed", opts.StealSeed)

	metrics := api.NewMetrics()
	rdb := c.Redis.Client()
	defer rdb.Close()
	stock.AddHook(rdb, metrics.RedisHook())

	// Before the ledger opens: a limit that cannot hold the process's own
	// connections stops it before any migration runs.
	poolSize, err := ledger.PoolSize(c.PostgresDSN)
	if err != nil {
		err = errors.New(redact(err.Error()))
		log.Error("cannot open the ledger", "err", err)
		return err
	}
	redisServers := 1 // a standalone client uses the first address alone
	if c.Redis.Mode == config.RedisCluster {
		redisServers = len(c.Redis.Addresses)
	}
	maxConns, err := maxConnections(log, opts.Server.MaxInFlight, ownFiles(redisServers, poolSize, opts.Ledger.Concurrency), opts.MetricsListen != "")
	if err != nil {
		return err
	}

	sctx, cancel := context.WithTimeout(ctx, startupTimeout)
	l, err := ledger.Open(sctx, c.PostgresDSN)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: nothing was served
		}
		err = errors.New(redact(err.Error()))
		log.Error("cannot open the ledger", "err", err)
		return err
	}
	defer l.Close()

	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(opts.GCPercent)
	}
	if lim := config.SetMemoryLimit(opts.MemoryLimit); lim > 0 {
		log.Info("Go memory limit set", "bytes", lim, "containerLimit", opts.MemoryLimit)
	}
	mc := opts.Ledger
	mc.OnBatch = metrics.ObserveBatch
	eng, err := engine.New(opts.engineConfig(), rdb, l, mc)
	if err != nil {
		return err
	}
	cfg := opts.Server
	cfg.Engine, cfg.AdmissionKey, cfg.Metrics, cfg.Logger, cfg.Addr = eng, c.AdmissionKey, metrics, log, opts.Listen
	cfg.AdmissionKeyAlt = c.AdmissionKeyAsSet
	cfg.AdmissionKeyPrevious = c.AdmissionKeyPrevious
	cfg.AdmissionKeyPreviousAlt = c.AdmissionKeyPreviousAsSet
	cfg.MetricsElsewhere = opts.MetricsListen != ""
	cfg.MaxConnections = maxConns
	srv, err := api.New(cfg)
	if err != nil {
		eng.Close()
		return err
	}
	if opts.MetricsListen != "" {
		// Served until the API has drained: the last scrape sees the shutdown.
		_, stop, err := serveAside("metrics-listen", opts.MetricsListen, srv.MetricsHandler(), log)
		if err != nil {
			eng.Close()
			return err
		}
		defer stop()
	}
	if opts.DebugListen != "" {
		_, stop, err := serveDebug(opts.DebugListen, log)
		if err != nil {
			eng.Close()
			return err
		}
		defer stop()
	}
	if err := srv.Start(ctx); err != nil {
		err = errors.New(redact(err.Error()))
		log.Error("serve", "err", err)
		return err
	}
	return nil
}

// engineConfig is the engine's configuration from the options: the
// campaign's, the reserve pipeline, and the steal draws seeded by
// --steal-seed when it is set.
func (o *Options) engineConfig() engine.Config {
	ec := o.Campaign.EngineConfig()
	ec.Pipeline = o.Pipeline
	if o.StealSeed != 0 {
		ec.Rand = rand.NewPCG(o.StealSeed, 0)
	}
	return ec
}

// redactor scrubs secret values from text that is about to be logged or returned:
// drivers quote connection strings in some errors, and not always redacted.
func redactor(c *config.Campaign) func(string) string {
	var secrets []string
	add := func(s string) {
		if len(s) >= 4 {
			secrets = append(secrets, s)
		}
	}
	add(c.PostgresDSN)
	add(c.Redis.Password)
	add(string(c.AdmissionKey))
	if u, err := url.Parse(c.PostgresDSN); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			add(pw)
			add(url.QueryEscape(pw))
		}
	}
	for _, f := range strings.Fields(c.PostgresDSN) {
		if v, ok := strings.CutPrefix(f, "password="); ok {
			add(strings.Trim(v, "'"))
		}
	}
	return func(s string) string {
		for _, secret := range secrets {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
		return s
	}
}

// serveDebug serves the Go profiles on their own listener, apart from the API,
// so they are never reachable through the sale's Service.
func serveDebug(addr string, log *slog.Logger) (bound string, stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return serveAside("debug-listen", addr, mux, log)
}

// serveAside serves h on a listener of its own (flag names the flag that set
// addr); stop closes it.
func serveAside(flag, addr string, h http.Handler, log *slog.Logger) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--%s: %w", flag, err)
	}
	// Timeouts of its own: the kubelet's probes and the scrapes come here,
	// and an idle or stalled client must not hold a file for ever.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 15 * time.Second, IdleTimeout: 60 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("serving", "flag", flag, "addr", ln.Addr().String())
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}
