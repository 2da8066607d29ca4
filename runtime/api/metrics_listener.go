package api

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

func (s *Server) metricsHandler() func(http.ResponseWriter, *http.Request) string {
	h := promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		Timeout:       5 * time.Second,
	})
	return func(w http.ResponseWriter, r *http.Request) string {
		h.ServeHTTP(w, r)
		return "OK"
	}
}

// MetricsHandler is what the process serves on its own listener (for
// Config.MetricsElsewhere): /metrics, and the probes /healthz and /readyz,
// which answer there exactly as on the API's port. The kubelet's probes go
// there, so that they never wait for a connection behind the buyers, whom
// the API's port may hold at a bound (Config.MaxConnections).
func (s *Server) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range []Route{
		{"metrics", http.MethodGet, config.PathMetrics, s.metricsHandler()},
		{"healthz", http.MethodGet, config.PathHealthz, s.healthz},
		{"readyz", http.MethodGet, config.PathReadyz, s.readyz},
	} {
		mux.Handle(rt.Method+" "+rt.Pattern, s.instrument(rt.Name, rt.handler))
		mux.Handle(rt.Pattern, s.instrument("other", methodNotAllowed("GET, HEAD")))
	}
	mux.Handle("/", s.instrument("other", func(w http.ResponseWriter, r *http.Request) string {
		return notFound("no such route on the metrics listener: /metrics, /healthz and /readyz").write(w)
	}))
	return mux
}
