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

// Package manager is the `flashsale manager` command: the operator's control
// plane, a controller-runtime manager that reconciles FlashSale objects.
package manager

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	goflag "flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/version"
	runtimeconfig "github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// LeaderElectionID names the Lease that elects the active manager, unless
// --leader-election-id names another (two installs in one namespace).
const LeaderElectionID = "flashsale-manager.flashsale.dev"

// Options are the manager's settings, one per flag.
type Options struct {
	// MetricsBindAddress serves Prometheus metrics; "0" disables them.
	MetricsBindAddress string
	// MetricsSecure serves them over HTTPS to clients the API server
	// authenticates (TokenReview) and allows to get /metrics
	// (SubjectAccessReview); false serves plain HTTP to anyone.
	MetricsSecure bool
	// MetricsCertDir holds the metrics endpoint's certificate, tls.crt and
	// tls.key (a mounted kubernetes.io/tls Secret), reloaded when they
	// change; empty: a self-signed certificate, which a scraper cannot
	// verify before it sends its token.
	MetricsCertDir string
	// EnableHTTP2 lets the metrics server negotiate HTTP/2. Off by default:
	// HTTP/2's stream handling has had denial-of-service flaws (the "Rapid
	// Reset" and "CONTINUATION flood" advisories) and a scraper needs only
	// HTTP/1.1.
	EnableHTTP2 bool
	// HealthProbeBindAddress serves /healthz and /readyz.
	HealthProbeBindAddress string
	// LeaderElect makes the manager wait for the Lease before reconciling.
	LeaderElect bool
	// LeaderElectionNamespace holds the Lease; empty means the pod's own
	// namespace (required when running outside a cluster with LeaderElect).
	LeaderElectionNamespace string
	// LeaderElectionID names the Lease, and with its namespace the install.
	LeaderElectionID string
	// Namespaces limits the watched namespaces; empty means all.
	Namespaces []string
	// Image is what the reserve and sweeper pods run: the operator's own image
	// (same binary, other subcommand).
	Image string
	// StatusRefresh is how often a live sale's status is refreshed and its Redis
	// checked for data loss.
	StatusRefresh time.Duration
	// MaxConcurrentReconciles is how many sales are reconciled at once, so
	// that one whose Redis or PostgreSQL hangs does not delay the others'
	// gates and status.
	MaxConcurrentReconciles int
	// ReconcileTimeout bounds one reconcile of one sale.
	ReconcileTimeout time.Duration
	// PhaseTimeout bounds each step of a reconcile but a rebuild.
	PhaseTimeout time.Duration
	// MemoryLimit is the container's memory limit in bytes (0: none): the
	// Go runtime keeps to nine tenths of it.
	MemoryLimit uint64

	// skipNameValidation lets a test start the manager more than once in
	// one process: controller-runtime refuses a controller name the process
	// has registered before.
	skipNameValidation bool
	// namespaceRecheckEvery, when set, replaces namespaceRecheckEvery.
	namespaceRecheckEvery time.Duration
}

// EnvImage names the operator's own image; config/manager sets it.
const EnvImage = "FLASHSALE_IMAGE"

// DefaultOptions are the flag defaults.
func DefaultOptions() Options {
	return Options{
		MetricsBindAddress:      ":8443",
		MetricsSecure:           true,
		HealthProbeBindAddress:  ":8081",
		Image:                   envOr(EnvImage, "flashsale-operator:"+version.Version),
		StatusRefresh:           controllers.DefaultStatusRefresh,
		MaxConcurrentReconciles: 8,
		ReconcileTimeout:        10 * time.Minute,
		PhaseTimeout:            controllers.DefaultPhaseTimeout,
		LeaderElectionID:        LeaderElectionID,
	}
}

// NewScheme returns the scheme of every type the manager reads or writes.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(flashsalev1alpha1.AddToScheme(s))
	return s
}

// NewCmd returns the `manager` command.
func NewCmd() *cobra.Command {
	opts := DefaultOptions()
	zapOpts := zap.Options{}
	var envErr error
	if v := os.Getenv(runtimeconfig.EnvMemoryLimit); v != "" {
		if opts.MemoryLimit, envErr = strconv.ParseUint(v, 10, 64); envErr != nil {
			envErr = fmt.Errorf("%s=%q: not a count of bytes", runtimeconfig.EnvMemoryLimit, v)
		}
	}

	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Run the operator: reconcile FlashSale objects",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if envErr != nil && !cmd.Flags().Changed("memory-limit") {
				return envErr
			}
			ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
			redisLog := ctrl.Log.WithName("redis-client")
			runtimeconfig.RouteRedisLogs(func(line string, dropped int) { redisLog.Info(line, "dropped", dropped) })
			cfg, err := config.GetConfig()
			if err != nil {
				return fmt.Errorf("loading the Kubernetes client configuration: %w", err)
			}
			return Run(cmd.Context(), cfg, opts)
		},
	}

	f := cmd.Flags()
	f.StringVar(&opts.MetricsBindAddress, "metrics-bind-address", opts.MetricsBindAddress,
		`address the metrics endpoint binds to; "0" disables it`)
	f.BoolVar(&opts.MetricsSecure, "metrics-secure", opts.MetricsSecure,
		"serve metrics over HTTPS (a self-signed certificate) to callers the API server authenticates and authorizes for GET /metrics; false: plain HTTP to anyone")
	f.StringVar(&opts.MetricsCertDir, "metrics-cert-dir", opts.MetricsCertDir,
		"directory holding the metrics endpoint's tls.crt and tls.key (a mounted kubernetes.io/tls Secret, reloaded when it changes) instead of a self-signed certificate")
	f.BoolVar(&opts.EnableHTTP2, "enable-http2", opts.EnableHTTP2,
		"let the metrics server negotiate HTTP/2 (off by default: HTTP/1.1 only)")
	f.StringVar(&opts.HealthProbeBindAddress, "health-probe-bind-address", opts.HealthProbeBindAddress,
		"address the /healthz and /readyz probes bind to")
	f.BoolVar(&opts.LeaderElect, "leader-elect", opts.LeaderElect,
		"elect one active manager through a Lease")
	f.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", opts.LeaderElectionNamespace,
		"namespace of the leader-election Lease (default: the pod's namespace)")
	f.StringVar(&opts.LeaderElectionID, "leader-election-id", opts.LeaderElectionID,
		"name of the leader-election Lease, which names this install in the sales it manages: two installs in one namespace need two names")
	f.StringSliceVar(&opts.Namespaces, "namespaces", opts.Namespaces,
		"comma-separated namespaces to watch (default: all)")
	f.StringVar(&opts.Image, "image", opts.Image,
		"image of the reserve and sweeper pods (default: $"+EnvImage+", the operator's own image; without it flashsale-operator:<this build's version>)")
	f.DurationVar(&opts.StatusRefresh, "status-refresh", opts.StatusRefresh,
		"how often a live sale's counts are refreshed and Redis is checked for data loss")
	f.IntVar(&opts.MaxConcurrentReconciles, "max-concurrent-reconciles", opts.MaxConcurrentReconciles,
		"sales reconciled at once: one whose Redis or PostgreSQL hangs does not hold up the others' gates and status")
	f.DurationVar(&opts.ReconcileTimeout, "reconcile-timeout", opts.ReconcileTimeout,
		"longest one reconcile of one sale may take before it is abandoned and retried; a deletion scans the Redis keyspace, so raise it for a Redis of ~10^8 keys (a rebuild runs off the reconcile and is not bounded by it)")
	f.DurationVar(&opts.PhaseTimeout, "phase-timeout", opts.PhaseTimeout,
		"longest each step of a reconcile but a rebuild may take (opening connections, counting the orders, writing the Deployments): a Redis or PostgreSQL that hangs shows as unreachable within it; raise it for sales whose counts take longer")
	f.Uint64Var(&opts.MemoryLimit, "memory-limit", opts.MemoryLimit,
		"the container's memory limit in bytes: the Go runtime collects harder as it nears 9/10 of it instead of being killed at it; 0: none; GOMEMLIMIT, when set, wins (env "+runtimeconfig.EnvMemoryLimit+", which the manifests set from limits.memory)")

	// --kubeconfig and the zap logging flags are Go flags.
	goflags := goflag.NewFlagSet("manager", goflag.ContinueOnError)
	config.RegisterFlags(goflags)
	zapOpts.BindFlags(goflags)
	f.AddGoFlagSet(goflags)

	return cmd
}

// Run starts the manager and blocks until ctx is cancelled (SIGINT or
// SIGTERM), then stops it and returns nil, or returns the error that stopped
// it.
func Run(ctx context.Context, cfg *rest.Config, opts Options) error {
	log := ctrl.Log.WithName("manager")
	if opts.MaxConcurrentReconciles < 1 || opts.ReconcileTimeout < time.Second {
		return fmt.Errorf("--max-concurrent-reconciles must be at least 1 (got %d) and --reconcile-timeout at least 1s (got %s)",
			opts.MaxConcurrentReconciles, opts.ReconcileTimeout)
	}
	if errs := validation.IsDNS1123Subdomain(opts.LeaderElectionID); opts.LeaderElect && len(errs) > 0 {
		return fmt.Errorf("--leader-election-id %q is not a Lease name: %s", opts.LeaderElectionID, strings.Join(errs, "; "))
	}
	if opts.PhaseTimeout < time.Second {
		return fmt.Errorf("--phase-timeout must be at least 1s, got %s", opts.PhaseTimeout)
	}
	// Above a minute, a quiet sale's counts would read stale (the
	// FlashSaleCountsStale alert, at two minutes) between two refreshes.
	if opts.StatusRefresh < 100*time.Millisecond || opts.StatusRefresh > time.Minute {
		return fmt.Errorf("--status-refresh must be between 100ms and 1m, got %s", opts.StatusRefresh)
	}
	if err := checkMetricsCert(opts); err != nil {
		return err
	}

	if lim := runtimeconfig.SetMemoryLimit(opts.MemoryLimit); lim > 0 {
		log.Info("Go memory limit set", "bytes", lim, "containerLimit", opts.MemoryLimit)
	}
	namespaces, refused, err := readableNamespaces(ctx, cfg, watchedNamespaces(opts.Namespaces))
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        NewScheme(),
		Metrics:                       metricsOptions(opts),
		HealthProbeBindAddress:        opts.HealthProbeBindAddress,
		LeaderElection:                opts.LeaderElect,
		LeaderElectionID:              opts.LeaderElectionID,
		LeaderElectionNamespace:       opts.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		Cache:                         controllers.CacheOptions(namespaces),
		Controller: ctrlconfig.Controller{
			MaxConcurrentReconciles: opts.MaxConcurrentReconciles,
			ReconciliationTimeout:   opts.ReconcileTimeout,
			SkipNameValidation:      &opts.skipNameValidation,
		},
		Client: controllers.ClientOptions(),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	if err := (&controllers.FlashSaleReconciler{
		Client:        mgr.GetClient(),
		Recorder:      mgr.GetEventRecorder("flashsale-controller"),
		Image:         opts.Image,
		StatusRefresh: opts.StatusRefresh,
		PhaseTimeout:  opts.PhaseTimeout,
		Install:       installName(opts.LeaderElect, opts.LeaderElectionNamespace, opts.LeaderElectionID),
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the FlashSale controller: %w", err)
	}
	if err := controllers.RegisterSaleMetrics(ctrlmetrics.Registry, mgr.GetCache()); err != nil {
		return fmt.Errorf("registering the sales' metrics: %w", err)
	}
	if err := controllers.RegisterReplacing(ctrlmetrics.Registry, unwatchedNamespaces(refused)); err != nil {
		return fmt.Errorf("registering the unwatched namespaces' metric: %w", err)
	}
	if len(refused) > 0 {
		every := cmp.Or(opts.namespaceRecheckEvery, namespaceRecheckEvery)
		if err := mgr.Add(refusedNamespaces{cfg: cfg, namespaces: refused, every: every}); err != nil {
			return fmt.Errorf("adding the refused namespaces' check: %w", err)
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}

	log.Info("starting", "version", version.Version, "commit", version.GitCommit,
		"namespaces", namespaces, "leaderElect", opts.LeaderElect)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	log.Info("stopped")
	return nil
}

// serviceAccountNamespace is where a pod's namespace is mounted; leader
// election puts its Lease there unless --leader-election-namespace says.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// installName is this install's name in the sales it manages
// (controllers.AnnotationOperator): its leader election Lease, in ns, else
// in the pod's namespace. Without leader election there is no Lease to tell
// whether it is there: no name (it claims no sale).
func installName(leaderElect bool, ns, id string) string {
	if !leaderElect {
		return ""
	}
	if ns == "" {
		if b, err := os.ReadFile(serviceAccountNamespace); err == nil {
			ns = strings.TrimSpace(string(b))
		}
	}
	return ns + "/" + id
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// watchedNamespaces trims the --namespaces values and drops empty ones, so
// that "--namespaces=" means all namespaces.
func watchedNamespaces(in []string) []string {
	var out []string
	for _, n := range in {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// metricsOptions: the manager's metrics tell about every sale in the cluster,
// so by default only callers the API server allows to get /metrics (Prometheus
// with the metrics-reader ClusterRole) read them.
func metricsOptions(opts Options) metricsserver.Options {
	o := metricsserver.Options{BindAddress: opts.MetricsBindAddress}
	if !opts.EnableHTTP2 {
		o.TLSOpts = append(o.TLSOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	if opts.MetricsSecure {
		o.SecureServing = true
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	if opts.MetricsCertDir != "" {
		o.CertDir, o.CertName, o.KeyName = opts.MetricsCertDir, metricsCertName, metricsKeyName
	}
	return o
}

// The names a kubernetes.io/tls Secret gives its certificate and key.
const metricsCertName, metricsKeyName = "tls.crt", "tls.key"

// checkMetricsCert refuses a --metrics-cert-dir the metrics server could
// not serve from, at the start rather than at the first scrape.
func checkMetricsCert(opts Options) error {
	if opts.MetricsCertDir == "" {
		return nil
	}
	if !opts.MetricsSecure {
		return errors.New("--metrics-cert-dir needs --metrics-secure: plain HTTP serves no certificate")
	}
	crt, key := filepath.Join(opts.MetricsCertDir, metricsCertName), filepath.Join(opts.MetricsCertDir, metricsKeyName)
	if _, err := tls.LoadX509KeyPair(crt, key); err != nil {
		return fmt.Errorf("--metrics-cert-dir %s: %w", opts.MetricsCertDir, err)
	}
	return nil
}
