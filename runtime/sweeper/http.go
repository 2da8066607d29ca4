package sweeper

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// ProbeTimeout bounds one readiness check: a probe must answer before the
// kubelet gives up on it (the operator's pods: 2 s; the kubelet's default 1 s).
const ProbeTimeout = 800 * time.Millisecond

// Handler serves /healthz (live: the sweep loop comes back, Runner.Live),
// /readyz (ready: the sweeper's own check, ReadyOnce over Redis and the
// ledger) and /metrics.
func Handler(g prometheus.Gatherer, live func() error, ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+config.PathHealthz, func(w http.ResponseWriter, _ *http.Request) {
		if err := live(); err != nil {
			http.Error(w, "not live: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET "+config.PathReadyz, func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), ProbeTimeout)
		defer cancel()
		if err := ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET "+config.PathMetrics, promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	return mux
}

// ReadyOnce is check until it first succeeds, then always ready: Redis and
// the ledger are shared by every replica, and a blip of either would fail
// them all at once, stalling a rollout and showing the sale's sweeper down
// after the outage is over. A sweeper that cannot reach them retries each
// pass and says so in its log and metrics.
func ReadyOnce(check func(context.Context) error) func(context.Context) error {
	var ready atomic.Bool
	return func(ctx context.Context) error {
		if ready.Load() {
			return nil
		}
		if err := check(ctx); err != nil {
			return err
		}
		ready.Store(true)
		return nil
	}
}

// shutdownTimeout bounds draining the probe and metrics connections.
const shutdownTimeout = 5 * time.Second

// Serve serves h on ln until ctx is cancelled, then shuts down gracefully.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
