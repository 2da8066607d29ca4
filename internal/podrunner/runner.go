// Package podrunner plays the kubelet's part where no cluster exists: it
// watches the Deployments and Services the operator creates and runs each
// replica as a local process of the project's binary, with the container's
// args and its environment resolved from the pod spec (Secrets, ConfigMaps,
// the downward API), runs its probes, restarts it when it crashes, reports the
// replicas back into the Deployment's status and exposes each Service on a
// local port.
//
// What runs is what the pod spec says, with these deliberate differences:
//
//   - The image is not pulled: the binary given in Config.Binary is the image's
//     entrypoint (/flashsale in the operator's image). A container whose command
//     names anything else is refused.
//   - Replicas share the host's network namespace, so each one listens on its
//     own 127.0.0.1 port: the runner overrides the listen address variable
//     (FLASHSALE_LISTEN) and maps the container port onto that port for probes
//     and Services. A further listen address the container sets (its
//     FLASHSALE_METRICS_LISTEN) gets a port of its own too, and its container
//     port (the address's) is mapped onto it the same way. These are the only
//     changes made to a replica's environment.
//   - There is no in-cluster API endpoint: no KUBERNETES_SERVICE_* variables and
//     no service account token are given to replicas (the operator's pods do not
//     mount one anyway).
//   - Resources, security contexts and volumes are not enforced; the processes
//     run as the runner's user. Rollouts replace one replica at a time (surge 1,
//     none unavailable), whatever the strategy says.
//   - Until its first success a readiness probe runs every 200 ms instead of
//     every periodSeconds, so that a new replica is ready sooner.
//
// Each replica's output goes to <Dir>/logs/<namespace>/<pod>.log.
package podrunner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// Defaults for Config's zero values.
const (
	// DefaultSelector picks the operator's children.
	DefaultSelector = "app.kubernetes.io/managed-by=flashsale-operator"
	// DefaultEntrypoint is the entrypoint of the operator's image.
	DefaultEntrypoint = "/flashsale"
	// DefaultListenEnv is the variable that holds a data-plane process's listen address.
	DefaultListenEnv      = config.EnvListen
	DefaultAsideListenEnv = config.EnvMetricsListen
	DefaultMaxGrace       = 30 * time.Second
	DefaultBackoffInitial = time.Second
	DefaultBackoffMax     = 30 * time.Second
	DefaultBackoffReset   = 10 * time.Second
	DefaultResync         = time.Second
)

// podTemplateHashLabel is the label Kubernetes puts on a Deployment's pods.
const podTemplateHashLabel = "pod-template-hash"

// Config configures a Runner.
type Config struct {
	Kube *rest.Config // required
	// Binary is the executable that stands in for the image (required).
	Binary string
	// Entrypoint is the image's entrypoint that Binary replaces.
	Entrypoint string
	// Dir holds the replicas' logs and working directories (required).
	Dir string
	// Namespaces to watch; empty means all.
	Namespaces []string
	// Selector is the label selector of the Deployments and Services to run.
	Selector string
	// ListenEnv is the variable set to each replica's own 127.0.0.1 address.
	ListenEnv string
	// AsideListenEnvs are further listen address variables: each one a
	// container sets gets its own 127.0.0.1 port, so replicas do not collide
	// (default: DefaultAsideListenEnv).
	AsideListenEnvs []string
	// Env is the environment the image would give every process, before the
	// container's own (default: PATH only).
	Env []string
	// MaxGrace caps a pod's terminationGracePeriodSeconds: SIGTERM, then SIGKILL.
	MaxGrace time.Duration
	// Restart backoff after a crash: doubling from BackoffInitial up to
	// BackoffMax, back to BackoffInitial after a process ran BackoffReset.
	BackoffInitial, BackoffMax, BackoffReset time.Duration
	// Resync is how often everything is reconciled even without events.
	Resync time.Duration
	// StateFile, if set, is rewritten with State (as JSON) whenever it changes.
	StateFile string
	// AdminURL is recorded in the state file (the runner does not serve it).
	AdminURL string
	Log      *slog.Logger
}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.MaxGrace, DefaultMaxGrace)
	def(&c.BackoffInitial, DefaultBackoffInitial)
	def(&c.BackoffMax, DefaultBackoffMax)
	def(&c.BackoffReset, DefaultBackoffReset)
	def(&c.Resync, DefaultResync)
	if c.Entrypoint == "" {
		c.Entrypoint = DefaultEntrypoint
	}
	if c.Selector == "" {
		c.Selector = DefaultSelector
	}
	if c.ListenEnv == "" {
		c.ListenEnv = DefaultListenEnv
	}
	if c.AsideListenEnvs == nil {
		c.AsideListenEnvs = []string{DefaultAsideListenEnv}
	}
	if c.Env == nil {
		c.Env = []string{"PATH=" + os.Getenv("PATH")}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Runner runs the replicas of Deployments as local processes. Create it with
// New and start it with Run.
type Runner struct {
	cfg      Config
	cs       kubernetes.Interface
	resolver resolver
	log      *slog.Logger
	kickCh   chan struct{}

	replicaCtx context.Context // outlives Run's context until every replica stopped

	mu        sync.Mutex
	deps      map[string]*deployment
	svcs      map[string]*service
	retired   []*replica // asked to stop, not gone yet
	depList   []appslisters.DeploymentLister
	svcList   []corelisters.ServiceLister
	lastState []byte
}

// deployment is what the runner knows of one Deployment.
type deployment struct {
	namespace, name string
	uid             types.UID
	obj             *appsv1.Deployment
	replicas        []*replica // not asked to stop, ordered by slot
	failure         string     // why its pods cannot run here

	// The last status written and the version of the object it was written
	// over: until the watch delivers our own write, the cached object still
	// shows the old status, which must not cause a second write.
	written   *appsv1.DeploymentStatus
	writtenRV string
}

// New checks the configuration.
func New(cfg Config) (*Runner, error) {
	cfg.defaults()
	if cfg.Kube == nil {
		return nil, errors.New("podrunner: a Kubernetes client configuration is required")
	}
	if cfg.Dir == "" {
		return nil, errors.New("podrunner: a working directory is required")
	}
	bin, err := filepath.Abs(cfg.Binary)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("podrunner: binary %q is not an executable file", cfg.Binary)
	}
	cfg.Binary = bin
	if cfg.Dir, err = filepath.Abs(cfg.Dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	if _, err := labels.Parse(cfg.Selector); err != nil {
		return nil, fmt.Errorf("podrunner: selector %q: %w", cfg.Selector, err)
	}
	kube := rest.CopyConfig(cfg.Kube)
	if kube.QPS == 0 && kube.Burst == 0 {
		// The kubelet's defaults (kubeAPIQPS, kubeAPIBurst): client-go's own
		// (5 and 10) make replicas wait on the rate limiter when many start.
		kube.QPS, kube.Burst = 50, 100
	}
	cs, err := kubernetes.NewForConfig(kube)
	if err != nil {
		return nil, err
	}
	return &Runner{
		cfg: cfg, cs: cs, resolver: resolver{cs: cs}, log: cfg.Log,
		kickCh: make(chan struct{}, 1),
		deps:   map[string]*deployment{}, svcs: map[string]*service{},
	}, nil
}

// kick asks for a reconcile soon.
func (r *Runner) kick() {
	select {
	case r.kickCh <- struct{}{}:
	default:
	}
}

// Run watches and runs until ctx ends, then stops every replica (SIGTERM, then
// SIGKILL after its grace period), closes the Service ports and returns.
func (r *Runner) Run(ctx context.Context) error {
	namespaces := r.cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	stopInformers := make(chan struct{})
	var factories []informers.SharedInformerFactory
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.kick() },
		UpdateFunc: func(any, any) { r.kick() },
		DeleteFunc: func(any) { r.kick() },
	}
	for _, ns := range namespaces {
		f := informers.NewSharedInformerFactoryWithOptions(r.cs, 10*time.Minute,
			informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = r.cfg.Selector }))
		deps, svcs := f.Apps().V1().Deployments(), f.Core().V1().Services()
		if _, err := deps.Informer().AddEventHandler(handler); err != nil {
			return err
		}
		if _, err := svcs.Informer().AddEventHandler(handler); err != nil {
			return err
		}
		r.depList = append(r.depList, deps.Lister())
		r.svcList = append(r.svcList, svcs.Lister())
		factories = append(factories, f)
	}
	for _, f := range factories {
		f.Start(stopInformers)
	}
	defer func() {
		close(stopInformers)
		for _, f := range factories {
			f.Shutdown()
		}
	}()
	for _, f := range factories {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("podrunner: watching %v: %w", typ, context.Cause(ctx))
			}
		}
	}

	replicaCtx, cancelReplicas := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReplicas()
	r.replicaCtx = replicaCtx
	r.log.Info("running", "binary", r.cfg.Binary, "namespaces", r.cfg.Namespaces, "selector", r.cfg.Selector, "dir", r.cfg.Dir)

	tick := time.NewTicker(r.cfg.Resync)
	defer tick.Stop()
	for {
		r.sync(ctx)
		select {
		case <-ctx.Done():
			r.shutdown()
			return nil
		case <-r.kickCh:
		case <-tick.C:
		}
	}
}

// shutdown stops every replica and waits for them, and closes every proxy.
func (r *Runner) shutdown() {
	r.mu.Lock()
	for _, st := range r.deps {
		r.retireAll(st)
	}
	r.deps = map[string]*deployment{}
	for k, s := range r.svcs {
		s.close()
		delete(r.svcs, k)
	}
	retired := slices.Clone(r.retired)
	r.mu.Unlock()
	for _, rp := range retired {
		<-rp.done
	}
	r.mu.Lock()
	r.retired = nil
	state := r.stateLocked()
	r.mu.Unlock()
	r.saveState(state)
	r.log.Info("stopped every replica")
}

// statusWrite is a Deployment status to write once the lock is released.
type statusWrite struct {
	obj    *appsv1.Deployment
	status appsv1.DeploymentStatus
}

// sync reconciles every Deployment and Service with what runs here.
func (r *Runner) sync(ctx context.Context) {
	r.mu.Lock()
	seen := map[string]bool{}
	var writes []statusWrite
	for _, d := range r.listDeployments() {
		if d.DeletionTimestamp != nil {
			continue // there is no garbage collector here to wait for
		}
		k := d.Namespace + "/" + d.Name
		seen[k] = true
		st := r.deps[k]
		if st != nil && st.uid != d.UID {
			r.retireAll(st)
			st = nil
		}
		if st == nil {
			st = &deployment{namespace: d.Namespace, name: d.Name, uid: d.UID}
			r.deps[k] = st
			r.log.Info("deployment found", "deployment", k)
		}
		st.obj = d
		r.reconcile(st)
		s := r.status(st)
		pending := st.written != nil && st.writtenRV == d.ResourceVersion && sameStatus(*st.written, s)
		if !pending && !sameStatus(d.Status, s) {
			writes = append(writes, statusWrite{obj: d, status: s})
			st.written, st.writtenRV = &s, d.ResourceVersion
		}
	}
	for k, st := range r.deps {
		if !seen[k] {
			r.log.Info("deployment gone: stopping its replicas", "deployment", k)
			r.retireAll(st)
			delete(r.deps, k)
		}
	}
	r.retired = slices.DeleteFunc(r.retired, func(rp *replica) bool {
		select {
		case <-rp.done:
			return true
		default:
			return false
		}
	})
	r.syncServices()
	state := r.stateLocked()
	r.mu.Unlock()

	for _, w := range writes {
		if err := r.writeStatus(ctx, w); err != nil {
			if ctx.Err() == nil {
				r.log.Warn("writing deployment status", "deployment", w.obj.Namespace+"/"+w.obj.Name, "err", err)
			}
			r.mu.Lock()
			if st := r.deps[w.obj.Namespace+"/"+w.obj.Name]; st != nil {
				st.written = nil // write it again on the next sync
			}
			r.mu.Unlock()
		}
	}
	r.saveState(state)
}

func (r *Runner) listDeployments() []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for _, l := range r.depList {
		ds, err := l.List(labels.Everything())
		if err != nil {
			continue
		}
		out = append(out, ds...)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

// unsupported says why a pod template cannot run here, or "".
func unsupported(t *corev1.PodTemplateSpec) string {
	switch {
	case len(t.Spec.Containers) != 1:
		return fmt.Sprintf("the local pod runner runs pods of exactly one container, this one has %d", len(t.Spec.Containers))
	case len(t.Spec.InitContainers) > 0:
		return "the local pod runner does not run init containers"
	case len(t.Spec.Containers[0].VolumeMounts) > 0:
		return "the local pod runner does not mount volumes"
	}
	return ""
}

// templateHash names a pod template version.
func templateHash(t *corev1.PodTemplateSpec) string {
	b, _ := json.Marshal(t)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:10]
}

// saveState writes the state file when its content changed.
func (r *Runner) saveState(state []byte) {
	if r.cfg.StateFile == "" || bytes.Equal(state, r.lastState) {
		return
	}
	tmp := r.cfg.StateFile + ".tmp"
	if err := os.WriteFile(tmp, state, 0o644); err != nil {
		r.log.Warn("writing the state file", "err", err)
		return
	}
	if err := os.Rename(tmp, r.cfg.StateFile); err != nil {
		r.log.Warn("writing the state file", "err", err)
		return
	}
	r.lastState = state
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
