// Package podrunner is the `podrunner` command (built on its own from
// internal/podrunner/podrunner, not a flashsale subcommand): the local pod
// runner that plays the kubelet's part for the operator's Deployments and
// Services where there is an API server but no node (`make demo
// DEMO_FLAGS=--node=false`, test/e2e).
package podrunner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flashsale-dev/flashsale-operator/internal/podrunner"
)

// Options are the command's settings.
type Options struct {
	Kubeconfig  string
	Binary      string
	Dir         string
	Namespaces  []string
	Selector    string
	AdminListen string
	StateFile   string
	MaxGrace    time.Duration
	Backoff     time.Duration
	BackoffMax  time.Duration
}

// NewCmd returns the `podrunner` command.
func NewCmd() *cobra.Command {
	o := Options{
		Dir:         "podrunner",
		Selector:    podrunner.DefaultSelector,
		AdminListen: "127.0.0.1:0",
		MaxGrace:    podrunner.DefaultMaxGrace,
		Backoff:     podrunner.DefaultBackoffInitial,
		BackoffMax:  podrunner.DefaultBackoffMax,
	}
	cmd := &cobra.Command{
		Use:   "podrunner",
		Short: "Run the operator's Deployments as local processes and expose its Services (no cluster needed)",
		Long: `Plays the kubelet's part against an API server that has no nodes: watches the
Deployments and Services selected by --selector and runs each replica as a
process of --binary (which stands in for the image's entrypoint, /flashsale)
with the container's args and environment, Secret and ConfigMap references
resolved. It runs the readiness and liveness probes, restarts crashed replicas
with a backoff, writes the replica counts into the Deployment's status, and
exposes each Service on a 127.0.0.1 port (round-robin over ready replicas).

Each replica listens on its own 127.0.0.1 port: FLASHSALE_LISTEN is the one
variable the runner changes. Replica logs go to --dir/logs. The exposed
Services and the replicas are written to --state-file and served as JSON on
the admin endpoint (GET /state; POST /kill?namespace=&deployment=&index=
SIGKILLs a replica for chaos tests).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)).With("role", "podrunner")
			return Run(cmd.Context(), o, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server (default: $KUBECONFIG or ~/.kube/config)")
	f.StringVar(&o.Binary, "binary", "", "the flashsale executable that stands in for the image's entrypoint (required)")
	f.StringVar(&o.Dir, "dir", o.Dir, "directory for replica logs and working directories")
	f.StringSliceVar(&o.Namespaces, "namespaces", nil, "comma-separated namespaces to watch (default: all)")
	f.StringVar(&o.Selector, "selector", o.Selector, "label selector of the Deployments and Services to run")
	f.StringVar(&o.AdminListen, "admin-listen", o.AdminListen, "loopback address of the admin endpoint (port 0: any free port)")
	f.StringVar(&o.StateFile, "state-file", "", "where to write the state as JSON (default: --dir/state.json)")
	f.DurationVar(&o.MaxGrace, "max-grace", o.MaxGrace, "upper bound of a pod's termination grace period (SIGTERM, then SIGKILL)")
	f.DurationVar(&o.Backoff, "restart-backoff", o.Backoff, "first wait before restarting a crashed replica (doubles on each crash)")
	f.DurationVar(&o.BackoffMax, "restart-backoff-max", o.BackoffMax, "longest wait before restarting a crashed replica")
	return cmd
}

// Run serves until ctx ends, then stops every replica and returns.
func Run(ctx context.Context, o Options, log *slog.Logger) error {
	// The runner is not the flashsale binary, so there is no default: its
	// own executable would be started as every replica.
	if o.Binary == "" {
		return errors.New("--binary is required: the flashsale executable the replicas run")
	}
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	loading.ExplicitPath = o.Kubeconfig
	kube, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, nil).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	if o.StateFile == "" {
		o.StateFile = filepath.Join(o.Dir, "state.json")
	}
	ln, err := listenLoopback(o.AdminListen)
	if err != nil {
		return err
	}
	adminURL := "http://" + ln.Addr().String()
	r, err := podrunner.New(podrunner.Config{
		Kube: kube, Binary: o.Binary, Dir: o.Dir, Namespaces: o.Namespaces, Selector: o.Selector,
		MaxGrace: o.MaxGrace, BackoffInitial: o.Backoff, BackoffMax: o.BackoffMax,
		StateFile: o.StateFile, AdminURL: adminURL, Log: log,
	})
	if err != nil {
		ln.Close()
		return err
	}
	srv := &http.Server{Handler: r.Handler(), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("admin endpoint", "url", adminURL, "stateFile", o.StateFile)

	runErr := r.Run(ctx)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	shutErr := srv.Shutdown(sctx)
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		shutErr = errors.Join(shutErr, err)
	}
	return errors.Join(runErr, shutErr)
}

// listenLoopback refuses any address but a loopback one: the admin endpoint
// can kill processes.
func listenLoopback(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--admin-listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("--admin-listen %q: only a loopback IP address (e.g. 127.0.0.1) is allowed", addr)
	}
	return net.Listen("tcp", addr)
}
