// Package sweeper is the `flashsale sweeper` command: it releases the expired
// reservations of one FlashSale, on the one replica that holds the sweeper
// Lease (in Kubernetes) or PostgreSQL advisory lock (elsewhere).
package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flashsale-dev/flashsale-operator/internal/version"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/sweeper"
)

// Leader lock kinds (--leader-lock).
const (
	LockAuto     = config.LeaderLockAuto
	LockLease    = config.LeaderLockLease
	LockPostgres = config.LeaderLockPostgres
)

// inClusterNamespaceFile holds the pod's namespace, the Lease's fallback
// namespace when --namespace is not given.
const inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// startupTimeout bounds connecting to the ledger at start.
const startupTimeout = config.StartupTimeout

// Options are the sweeper's settings.
type Options struct {
	Campaign   config.Campaign
	Interval   time.Duration
	Listen     string
	Kubeconfig string
	LeaderLock string
	LogLevel   string

	env config.EnvDefaults // malformed environment values, reported by Complete
}

// NewCmd returns the `sweeper` command.
func NewCmd() *cobra.Command {
	var opts Options
	cmd := &cobra.Command{
		Use:   "sweeper",
		Short: "Release expired reservations of one FlashSale (one active replica)",
		Long: `Every --interval, the replica holding the leadership sweeps every shard:
expired reservations are cancelled in the ledger, then their units go back to stock.
Leadership is a Kubernetes Lease (flashsale-sweeper-<campaign id>) when --kubeconfig
is given or the process runs in a cluster, otherwise a PostgreSQL advisory lock;
--leader-lock chooses explicitly.
Two active sweepers would still be safe; leadership only avoids duplicate work.
It reads the same campaign configuration as reserve, except the admission key,
which it does not need.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.env.Err(); err != nil {
				return err
			}
			log, err := config.NewLogger(cmd.ErrOrStderr(), opts.LogLevel)
			if err != nil {
				return err
			}
			config.RouteRedisLogs(config.SlogRedisSink(log))
			if err := opts.Campaign.Complete(); err != nil {
				return err
			}
			return Run(cmd.Context(), opts, log.With("role", "sweeper", "campaign", opts.Campaign.ID))
		},
	}
	opts.AddFlags(cmd.Flags())
	return cmd
}

// AddFlags registers the flags; their defaults come from the environment. A
// malformed value is reported by Complete.
func (o *Options) AddFlags(f *pflag.FlagSet) {
	// The sweeper never checks a token nor derives a reservation id.
	o.Campaign.WithoutAdmissionKey = true
	o.Campaign.AddFlags(f)
	f.DurationVar(&o.Interval, "interval", o.env.Duration(config.EnvSweepInterval, 30*time.Second), "time between sweep passes (env "+config.EnvSweepInterval+")")
	f.StringVar(&o.Listen, "listen", config.EnvString(config.EnvListen, config.DefaultListen), "address of /healthz, /readyz and /metrics (env "+config.EnvListen+")")
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file: elect the sweeper with a Lease through this API server (in a cluster the Lease is used without it)")
	f.StringVar(&o.LeaderLock, "leader-lock", config.EnvString(config.EnvLeaderLock, LockAuto),
		"how one active sweeper is elected: auto (a Lease with --kubeconfig or in a cluster, else postgres), lease, or postgres (env "+config.EnvLeaderLock+")")
	f.StringVar(&o.LogLevel, "log-level", config.EnvString(config.EnvLogLevel, "info"), "debug, info, warn or error (env "+config.EnvLogLevel+")")
}

// Complete reads the campaign's secrets and checks the settings, naming what
// is wrong.
func (o *Options) Complete() error {
	if err := o.env.Err(); err != nil {
		return err
	}
	return o.Campaign.Complete()
}

// Run sweeps until ctx is cancelled, then finishes the current pass, gives
// leadership up and returns nil.
func Run(ctx context.Context, opts Options, log *slog.Logger) error {
	if opts.Interval <= 0 {
		return fmt.Errorf("--interval must be positive, got %s", opts.Interval)
	}
	camp := &opts.Campaign
	sctx, cancel := context.WithTimeout(ctx, startupTimeout)
	l, err := ledger.Open(sctx, camp.PostgresDSN)
	cancel()
	if err != nil {
		return err
	}
	defer l.Close()
	rdb := camp.Redis.Client()
	defer rdb.Close()
	eng, err := engine.New(camp.EngineConfig(), rdb, l, ledger.MaterializerConfig{})
	if err != nil {
		return err
	}
	defer eng.Close()

	elector, err := newElector(opts, log)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := sweeper.NewMetrics(reg)

	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	ready := sweeper.ReadyOnce(func(ctx context.Context) error {
		return errors.Join(eng.PingRedis(ctx), l.Ping(ctx))
	})
	// The probe server outlives ctx until the last pass is over, so a
	// terminating pod still reports while it finishes.
	srvCtx, stopSrv := context.WithCancel(context.WithoutCancel(ctx))
	srvDone := make(chan error, 1)
	r := &sweeper.Runner{Pass: eng.Sweep, Elector: elector, Interval: opts.Interval, Metrics: metrics, Log: log}
	go func() { srvDone <- sweeper.Serve(srvCtx, ln, sweeper.Handler(reg, r.Live, ready)) }()

	log.Info("starting", "version", version.Version, "interval", opts.Interval, "election", elector.Kind(),
		"listen", ln.Addr().String(), "shards", camp.Shards, "grace", camp.GracePeriod)
	runErr := r.Run(ctx)
	stopSrv()
	srvErr := <-srvDone
	log.Info("stopped")
	return errors.Join(runErr, srvErr)
}

// newElector picks the lock --leader-lock names; auto takes the Lease when
// there is a Kubernetes API server to talk to, the advisory lock otherwise.
func newElector(opts Options, log *slog.Logger) (sweeper.Elector, error) {
	camp := &opts.Campaign
	inCluster := os.Getenv("KUBERNETES_SERVICE_HOST") != ""
	switch opts.LeaderLock {
	case LockPostgres:
		return sweeper.NewAdvisoryLock(camp.PostgresDSN, camp.ID)
	case LockAuto:
		if opts.Kubeconfig == "" && !inCluster {
			return sweeper.NewAdvisoryLock(camp.PostgresDSN, camp.ID)
		}
	case LockLease:
	default:
		return nil, fmt.Errorf("--leader-lock must be %s, %s or %s, got %q", LockAuto, LockLease, LockPostgres, opts.LeaderLock)
	}
	var rc *rest.Config
	var err error
	if opts.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	ns := camp.Namespace
	if ns == "" {
		b, err := os.ReadFile(inClusterNamespaceFile)
		if err != nil {
			return nil, fmt.Errorf("--namespace (or %s) is required for the sweeper Lease", config.EnvNamespace)
		}
		ns = strings.TrimSpace(string(b))
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return sweeper.NewLease(cs, ns, sweeper.LeaseName(camp.ID), sweeper.Identity(), sweeper.DefaultLeaseTiming, log)
}
