// Package api is the HTTP server of one FlashSale (`flashsale reserve`): the
// buyer routes (reserve, checkout, cancel, the buyer's reservations) behind
// admission tokens and a per-user rate limit, the public availability route,
// health probes and Prometheus metrics. It turns the engine's outcomes into
// stable error codes; docs/api.md is its contract.
package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Defaults for Config's zero values.
const (
	DefaultRequestTimeout    = 5 * time.Second
	DefaultAvailabilityCache = 200 * time.Millisecond
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 10 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultShutdownTimeout   = 25 * time.Second // inside Kubernetes' default 30 s grace period
)

// ReadyTimeout bounds one readiness probe's Redis and ledger checks: below
// the operator's probe timeout (2 s), so a slow Redis or ledger is answered
// 503 and logged here instead of ending as the kubelet's timeout.
const ReadyTimeout = 1500 * time.Millisecond

// Config configures a Server. Zero durations and sizes take the defaults above.
type Config struct {
	Engine       *engine.Engine // required; the server closes it when Serve returns
	AdmissionKey []byte         // required: the HMAC key of admission tokens
	// AdmissionKeyAlt, when set, is taken too: the key with the trailing
	// newline a Secret made from a file keeps (config.AdmissionKeyAsSet).
	AdmissionKeyAlt []byte
	// AdmissionKeyPrevious, when set, is taken too: the key a rotation
	// replaces (config.AdmissionKeyPrevious).
	AdmissionKeyPrevious []byte
	// AdmissionKeyPreviousAlt is to AdmissionKeyPrevious what
	// AdmissionKeyAlt is to AdmissionKey (config.AdmissionKeyPreviousAsSet).
	AdmissionKeyPreviousAlt []byte
	Metrics                 *Metrics     // nil: NewMetrics(); one server per Metrics (it adds its stock gauges)
	Logger                  *slog.Logger // nil: discard

	Addr string // for Start; default ":8080"
	// MetricsElsewhere leaves /metrics off the API's routes: the caller serves
	// MetricsHandler, with the probes, on a listener of its own, away from
	// the buyers.
	MetricsElsewhere bool

	// RateLimit is each user's sustained requests per second on the buyer routes
	// and RateBurst the bucket size; a RateLimit of 0 disables the limit.
	RateLimit float64
	RateBurst int

	RequestTimeout time.Duration // deadline of one request's wait in line and its Redis and SQL work
	// MaxInFlight is the most buyer requests (all but availability) taken in
	// at once: min(DefaultWorking, MaxInFlight) of them do their Redis and
	// SQL work, the others wait in line for a place, at most half of
	// RequestTimeout. One more, or one that waited that long, is answered 503
	// UNAVAILABLE with Retry-After (inFlight). 0: DefaultMaxInFlight;
	// negative: no bound, on the work either.
	MaxInFlight int
	working     int           // places at work; 0: DefaultWorking (tests set fewer)
	idleGrace   time.Duration // of the bounded listener; 0: idleGrace (tests set another)
	// MaxConnections is the most client connections held open at once; 0:
	// no bound. Past it the listener accepts none until one closes, and the
	// next wait in the kernel's listen queue: the process keeps the files
	// its own connections to Redis and the ledger, and its metrics
	// listener, need (boundedListener).
	MaxConnections    int
	MaxBodyBytes      int64
	AvailabilityCache time.Duration // how long one Redis read of the shards serves availability
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration // whole request, body included
	WriteTimeout      time.Duration // default: RequestTimeout + 5s; the answer itself then gets answerWriteTime
	IdleTimeout       time.Duration
	ShutdownTimeout   time.Duration // how long in-flight requests may take to finish
	// DrainDelay keeps serving with /readyz failing for a while after the stop
	// signal, so load balancers stop routing here before the listener closes,
	// and clients move their kept-alive connections (each answer then closes
	// its own) before Shutdown closes the idle ones.
	DrainDelay time.Duration

	Now func() time.Time // for tests; nil: time.Now
}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.RequestTimeout, DefaultRequestTimeout)
	def(&c.AvailabilityCache, DefaultAvailabilityCache)
	def(&c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&c.ReadTimeout, DefaultReadTimeout)
	def(&c.WriteTimeout, c.RequestTimeout+5*time.Second)
	def(&c.IdleTimeout, DefaultIdleTimeout)
	def(&c.ShutdownTimeout, DefaultShutdownTimeout)
	if c.Addr == "" {
		c.Addr = ":8080"
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.working <= 0 {
		c.working = DefaultWorking
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.RateBurst <= 0 {
		c.RateBurst = max(1, int(2*c.RateLimit))
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Server serves one FlashSale. Build it with New, run it with Start or Serve.
type Server struct {
	cfg     Config
	engine  *engine.Engine
	sku     string
	metrics *Metrics
	log     *slog.Logger
	limiter *limiter
	// verifiers check admission tokens with the key and, when set, the
	// alternative and the previous key, in that order, without keying an
	// HMAC per request.
	verifiers []*admission.Verifier
	mux       *http.ServeMux
	handler   http.Handler // mux behind canonicalOnly
	routes    []Route

	draining atomic.Bool
	// conns holds the buyers' connections at Config.MaxConnections; nil
	// without a bound. Set by Serve.
	conns atomic.Pointer[boundedListener]
	// confirmed: the ledger has shown the campaign as configured (readyz).
	confirmed atomic.Bool
	// ready keeps the ledger's last answer to a confirmed replica's readyz;
	// readyChecks counts the queries it made.
	ready       readyMemo
	readyChecks atomic.Int64
	// failureLogs keeps failed requests from flooding the log in an outage.
	failureLogs logSampler

	deadlines *requestDeadlines // the contexts of the buyer routes' work
	inFlight  inFlight          // the buyer requests doing that work
	snapSem   chan struct{}     // one shard read at a time; waiters honour their context
	snap      *stockSnapshot
}

// Route is one registered route, as docs/openapi.yaml documents it.
type Route struct {
	Name    string // metrics label
	Method  string
	Pattern string // path, with {parameters}
	handler func(http.ResponseWriter, *http.Request) string
}

// New checks the configuration and builds the routes.
func New(cfg Config) (*Server, error) {
	if cfg.Engine == nil {
		return nil, errors.New("api: an engine is required")
	}
	if len(cfg.AdmissionKey) < admission.MinKeyLen {
		return nil, admission.ErrKey
	}
	if cfg.RateLimit < 0 || cfg.RateBurst < 0 {
		return nil, fmt.Errorf("api: rate limit %v/s burst %d must not be negative", cfg.RateLimit, cfg.RateBurst)
	}
	cfg.defaults()
	s := &Server{
		cfg:       cfg,
		engine:    cfg.Engine,
		sku:       cfg.Engine.Config().SKU,
		metrics:   cfg.Metrics,
		log:       cfg.Logger,
		limiter:   newLimiter(cfg.RateLimit, cfg.RateBurst),
		snapSem:   make(chan struct{}, 1),
		deadlines: newRequestDeadlines(cfg.RequestTimeout),
	}
	s.inFlight.init(cfg.MaxInFlight, cfg.working, cfg.RequestTimeout/2)
	for i, key := range [][]byte{cfg.AdmissionKey, cfg.AdmissionKeyAlt, cfg.AdmissionKeyPrevious, cfg.AdmissionKeyPreviousAlt} {
		if i > 0 && len(key) == 0 {
			continue
		}
		v, err := admission.NewVerifier(key)
		if err != nil {
			return nil, fmt.Errorf("api: the %s: %w", [...]string{"admission key", "alternative admission key", "previous admission key", "alternative previous admission key"}[i], err)
		}
		s.verifiers = append(s.verifiers, v)
	}
	s.routes = []Route{
		{"reserve", http.MethodPost, "/api/v1/flash-sale/reserve", s.reserve},
		{"checkout", http.MethodPost, "/api/v1/flash-sale/checkout", s.checkout},
		{"cancel", http.MethodDelete, "/api/v1/flash-sale/reservations/{reservation_id}", s.cancel},
		{"held", http.MethodGet, "/api/v1/flash-sale/reservations", s.held},
		{"availability", http.MethodGet, "/api/v1/flash-sale/items/{item_id}/availability", s.availability},
		{"healthz", http.MethodGet, config.PathHealthz, s.healthz},
		{"readyz", http.MethodGet, config.PathReadyz, s.readyz},
	}
	if !cfg.MetricsElsewhere {
		s.routes = append(s.routes, Route{"metrics", http.MethodGet, config.PathMetrics, s.metricsHandler()})
	}
	s.metrics.reg.MustRegister(append(append(s.inFlightGauges(), s.connectionGauges()...), stockCollector{s})...)
	s.mux = http.NewServeMux()
	allowed := map[string][]string{}
	for _, rt := range s.routes {
		s.mux.Handle(rt.Method+" "+rt.Pattern, s.instrument(rt.Name, rt.handler))
		allowed[rt.Pattern] = append(allowed[rt.Pattern], rt.Method)
	}
	// The mux's own 404 and 405 answers are plain text; ours keep the error format.
	for pattern, methods := range allowed {
		if slices.Contains(methods, http.MethodGet) {
			methods = append(methods, http.MethodHead)
		}
		sort.Strings(methods)
		s.mux.Handle(pattern, s.instrument("other", methodNotAllowed(strings.Join(methods, ", "))))
	}
	s.mux.Handle("/", s.instrument("other", func(w http.ResponseWriter, r *http.Request) string {
		return notFound("no such route").write(w)
	}))
	s.handler = s.closeWhenDraining(s.canonicalOnly(s.mux))
	return s, nil
}

// closeWhenDraining answers with "Connection: close" once the server drains,
// so each kept-alive connection is closed by its own next answer and the
// client opens a new one (to another replica). Without it the connections
// stay until Shutdown closes the idle ones, and a request a client sends on
// one at that moment gets no answer: a reservation's POST is not retried by
// HTTP clients. It does the same while the connections are at their bound
// (Config.MaxConnections), so that a kept-alive connection does not hold its
// place while others wait to be accepted.
func (s *Server) closeWhenDraining(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() || s.conns.Load().full() {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

func methodNotAllowed(allow string) func(http.ResponseWriter, *http.Request) string {
	return func(w http.ResponseWriter, r *http.Request) string {
		w.Header().Set("Allow", allow)
		return errorf(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "use "+allow+" on this route").write(w)
	}
}

// Routes lists the registered routes.
func (s *Server) Routes() []Route { return append([]Route(nil), s.routes...) }

// Handler is the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// canonicalOnly answers a path that the mux would redirect to its cleaned
// form (dot segments, double slashes) with a JSON 404: a redirect is no
// answer an API client expects, and a DELETE that follows one lands on
// another resource than the one it named.
func (s *Server) canonicalOnly(next http.Handler) http.Handler {
	other := s.instrument("other", func(w http.ResponseWriter, r *http.Request) string {
		return notFound("no such route: the path is not in canonical form").write(w)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !canonicalPath(r.URL.Path) {
			other.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// canonicalPath: p is its own cleaned form, as http.ServeMux cleans it
// (path.Clean, keeping a trailing slash).
func canonicalPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// Metrics returns the server's metrics.
func (s *Server) Metrics() *Metrics { return s.metrics }

func (s *Server) instrument(route string, h func(http.ResponseWriter, *http.Request) string) http.Handler {
	latency := s.metrics.latency.WithLabelValues(route)
	// The (route, code) counters, looked up once each: codes are the API's
	// few constants, and a label lookup per request hashes both values.
	var counters sync.Map // code -> prometheus.Counter
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		code := h(w, r)
		latency.Observe(time.Since(start).Seconds())
		c, ok := counters.Load(code)
		if !ok {
			c, _ = counters.LoadOrStore(code, s.metrics.requests.WithLabelValues(route, code))
		}
		c.(prometheus.Counter).Inc()
	})
}

// Start listens on Config.Addr and serves until ctx is cancelled (see Serve).
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		s.engine.Close()
		return fmt.Errorf("api: listen on %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx is cancelled, then shuts down gracefully: /readyz
// fails at once and every answer closes its connection, after DrainDelay the
// listener closes, in-flight requests finish
// (a reservation whose ledger row is written gets its answer) within
// ShutdownTimeout, and last the engine is closed, which flushes the group-commit
// writer. It returns nil after a clean shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	defer s.engine.Close()
	var bl *boundedListener
	if s.cfg.MaxConnections > 0 {
		bl = newBoundedListener(ln, s.cfg.MaxConnections)
		if s.cfg.idleGrace > 0 {
			bl.grace = s.cfg.idleGrace
		}
		s.conns.Store(bl)
		ln = bl
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		// Requests must outlive the stop signal: Shutdown drains them, and a
		// cancelled context would abort reservations that are being written.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	if bl != nil {
		srv.ConnState = bl.connState
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("serving", "addr", ln.Addr().String(), "sku", s.sku)

	select {
	case err := <-errc:
		return fmt.Errorf("api: serve: %w", err)
	case <-ctx.Done():
	}
	s.draining.Store(true)
	s.log.Info("stopping: draining in-flight requests", "drainDelay", s.cfg.DrainDelay.String(), "timeout", s.cfg.ShutdownTimeout.String())
	if s.cfg.DrainDelay > 0 {
		time.Sleep(s.cfg.DrainDelay)
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		_ = srv.Close()
		err = fmt.Errorf("api: requests still running after %s: %w", s.cfg.ShutdownTimeout, err)
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	s.log.Info("stopped")
	return err
}

// stockSnapshot is one read of every shard.
type stockSnapshot struct {
	at        time.Time
	shards    []stock.ShardState
	available int64
	status    string
}

// snapshot returns the shards as read at most AvailabilityCache ago.
func (s *Server) snapshot(ctx context.Context) (*stockSnapshot, error) {
	select {
	case s.snapSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.snapSem }()
	now := s.cfg.Now()
	if s.snap != nil && now.Sub(s.snap.at) < s.cfg.AvailabilityCache {
		return s.snap, nil
	}
	states, err := s.engine.Gates().ShardStates(ctx)
	if err != nil {
		return nil, err
	}
	snap := &stockSnapshot{at: now, shards: states}
	for _, st := range states {
		snap.available += st.Available
	}
	snap.status = saleStatus(states, snap.available, now)
	s.snap = snap
	return snap, nil
}

// Sale statuses reported by the availability route.
const (
	StatusOpen       = "OPEN"
	StatusSoldOut    = "SOLD_OUT"
	StatusNotStarted = "NOT_STARTED"
	StatusPaused     = "PAUSED"
	StatusEnded      = "ENDED"
	StatusClosed     = "CLOSED" // shards missing or being rebuilt
)

// saleStatus folds the shards' gates (the controller sets them all alike) into
// one. An open shard outside the sale's window, which the reserve script
// refuses by the Redis clock, counts as the script answers (by this
// process's clock).
func saleStatus(shards []stock.ShardState, available int64, now time.Time) string {
	state := stock.StateOpen
	for _, sh := range shards {
		switch {
		case !sh.Present || sh.State == stock.StateRebuilding || sh.Unverified:
			return StatusClosed
		case sh.State != stock.StateOpen:
			state = sh.State
		default:
			if why := sh.OutsideWindow(now); why != "" {
				state = why
			}
		}
	}
	switch state {
	case stock.StateOpen:
		if available <= 0 {
			return StatusSoldOut
		}
		return StatusOpen
	case stock.StateNotStarted:
		return StatusNotStarted
	case stock.StatePaused:
		return StatusPaused
	case stock.StateEnded:
		return StatusEnded
	}
	return StatusClosed
}

// limitBody refuses a declared oversize body at once and caps what is read.
func (s *Server) limitBody(w http.ResponseWriter, r *http.Request) (io.Reader, *apiError) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return nil, errorf(http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("the body exceeds %d bytes", s.cfg.MaxBodyBytes))
	}
	return http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), nil
}
