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
//     FLASHSALE_METRICS_LISTEN) gets a port of its own too, not mapped. These
//     are the only changes made to a replica's environment.
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
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/uuid"
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

// reconcile brings the replicas of one Deployment toward its spec: scale up and
// down, and replace replicas of an older template one at a time, never with
// fewer ready replicas than asked for while the new ones are not ready.
func (r *Runner) reconcile(st *deployment) {
	d := st.obj
	if st.failure = unsupported(&d.Spec.Template); st.failure != "" {
		r.retireAll(st)
		return
	}
	desired := 1
	if d.Spec.Replicas != nil {
		desired = int(*d.Spec.Replicas)
	}
	hash := templateHash(&d.Spec.Template)
	var cur, old []*replica
	for _, rp := range st.replicas {
		if rp.hash == hash {
			cur = append(cur, rp)
		} else {
			old = append(old, rp)
		}
	}
	ready := func(rp *replica) bool { return rp.snapshot().ready }
	// Old replicas that are not ready serve nothing: replace them at once.
	for _, rp := range old {
		if !ready(rp) {
			r.retire(st, rp)
		}
	}
	old = slices.DeleteFunc(old, func(rp *replica) bool { return rp.stopping() })
	// Scale down: not-ready replicas first, then the highest slots.
	if len(cur) > desired {
		slices.SortStableFunc(cur, func(a, b *replica) int {
			ra, rb := ready(a), ready(b)
			if ra != rb {
				if ra {
					return 1
				}
				return -1
			}
			return b.slot - a.slot
		})
		for _, rp := range cur[:len(cur)-desired] {
			r.retire(st, rp)
		}
		cur = cur[len(cur)-desired:]
	}
	const surge = 1
	for len(cur) < desired && len(cur)+len(old) < desired+surge {
		cur = append(cur, r.newReplica(st, hash))
	}
	readyCur, readyOld := 0, 0
	for _, rp := range cur {
		if ready(rp) {
			readyCur++
		}
	}
	readyOld = len(old) // only ready ones are left
	for _, rp := range old {
		if readyCur+readyOld-1 < desired {
			break
		}
		r.retire(st, rp)
		readyOld--
	}
}

// newReplica starts a replica in the lowest free slot.
func (r *Runner) newReplica(st *deployment, hash string) *replica {
	d := st.obj
	used := map[string]bool{}
	for _, rp := range st.replicas {
		used[rp.name] = true
	}
	for _, rp := range r.retired {
		if rp.namespace == st.namespace {
			used[rp.name] = true
		}
	}
	slot, name := 0, ""
	for ; ; slot++ {
		name = fmt.Sprintf("%s-%s-%d", d.Name, hash, slot)
		if !used[name] {
			break
		}
	}
	tmpl := d.Spec.Template.DeepCopy()
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	tmpl.Labels[podTemplateHashLabel] = hash
	grace := r.cfg.MaxGrace
	if g := tmpl.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = min(grace, time.Duration(*g)*time.Second)
	}
	rp := &replica{
		r: r, namespace: st.namespace, deployment: st.name, slot: slot, name: name,
		uid: string(uuid.NewUUID()), hash: hash, template: tmpl, grace: grace,
		logPath: filepath.Join(r.cfg.Dir, "logs", st.namespace, name+".log"),
		dir:     filepath.Join(r.cfg.Dir, "pods", st.namespace, name),
		stopCh:  make(chan struct{}), done: make(chan struct{}), phase: PhasePending,
	}
	st.replicas = append(st.replicas, rp)
	sort.Slice(st.replicas, func(i, j int) bool {
		if st.replicas[i].slot != st.replicas[j].slot {
			return st.replicas[i].slot < st.replicas[j].slot
		}
		return st.replicas[i].name < st.replicas[j].name
	})
	go rp.run(r.replicaCtx)
	return rp
}

func (r *Runner) retire(st *deployment, rp *replica) {
	rp.stop()
	st.replicas = slices.DeleteFunc(st.replicas, func(x *replica) bool { return x == rp })
	r.retired = append(r.retired, rp)
}

func (r *Runner) retireAll(st *deployment) {
	for _, rp := range slices.Clone(st.replicas) {
		r.retire(st, rp)
	}
}

// Deployment condition reasons, as the Kubernetes deployment controller writes them.
const (
	reasonMinimumAvailable   = "MinimumReplicasAvailable"
	reasonMinimumUnavailable = "MinimumReplicasUnavailable"
	reasonNewRSAvailable     = "NewReplicaSetAvailable"
	reasonRSUpdated          = "ReplicaSetUpdated"
	reasonFailedCreate       = "FailedCreate"
)

// status is the Deployment status the replicas amount to.
func (r *Runner) status(st *deployment) appsv1.DeploymentStatus {
	d := st.obj
	desired := int32(1)
	if d.Spec.Replicas != nil {
		desired = *d.Spec.Replicas
	}
	hash := templateHash(&d.Spec.Template)
	minReady := time.Duration(d.Spec.MinReadySeconds) * time.Second
	s := appsv1.DeploymentStatus{ObservedGeneration: d.Generation}
	var failures []string
	for _, rp := range st.replicas {
		snap := rp.snapshot()
		s.Replicas++
		if rp.hash == hash {
			s.UpdatedReplicas++
		}
		if snap.ready {
			s.ReadyReplicas++
			if time.Since(snap.readySince) >= minReady {
				s.AvailableReplicas++
			}
		}
		if snap.phase == PhaseWaiting && snap.lastError != "" && snap.lastExit == "" {
			failures = append(failures, rp.name+": "+snap.lastError)
		}
	}
	s.UnavailableReplicas = max(desired-s.AvailableReplicas, 0)

	maxUnavailable := intstr.FromString("25%")
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		maxUnavailable = *ru.MaxUnavailable
	}
	mu, _ := intstr.GetScaledValueFromIntOrPercent(&maxUnavailable, int(desired), false)
	now := metav1.Now()
	cond := func(typ appsv1.DeploymentConditionType, ok bool, reason, msg string) {
		status := corev1.ConditionFalse
		if ok {
			status = corev1.ConditionTrue
		}
		c := appsv1.DeploymentCondition{Type: typ, Status: status, Reason: reason, Message: msg, LastUpdateTime: now, LastTransitionTime: now}
		for _, old := range d.Status.Conditions {
			if old.Type != typ {
				continue
			}
			if old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
				if old.Reason == c.Reason && old.Message == c.Message {
					c.LastUpdateTime = old.LastUpdateTime
				}
			}
		}
		s.Conditions = append(s.Conditions, c)
	}
	if s.AvailableReplicas >= desired-int32(mu) {
		cond(appsv1.DeploymentAvailable, true, reasonMinimumAvailable, "Deployment has minimum availability.")
	} else {
		cond(appsv1.DeploymentAvailable, false, reasonMinimumUnavailable, "Deployment does not have minimum availability.")
	}
	if s.UpdatedReplicas == desired && s.Replicas == desired && s.AvailableReplicas == desired {
		cond(appsv1.DeploymentProgressing, true, reasonNewRSAvailable, fmt.Sprintf("Deployment %q has successfully progressed.", d.Name))
	} else {
		cond(appsv1.DeploymentProgressing, true, reasonRSUpdated, fmt.Sprintf("Deployment %q is progressing.", d.Name))
	}
	if st.failure != "" {
		failures = append(failures, st.failure)
	}
	if len(failures) > 0 {
		sort.Strings(failures)
		cond(appsv1.DeploymentReplicaFailure, true, reasonFailedCreate, truncate(failures[0], 512))
	}
	return s
}

// sameStatus compares statuses without the condition timestamps.
func sameStatus(a, b appsv1.DeploymentStatus) bool {
	strip := func(s appsv1.DeploymentStatus) appsv1.DeploymentStatus {
		s = *s.DeepCopy()
		for i := range s.Conditions {
			s.Conditions[i].LastUpdateTime, s.Conditions[i].LastTransitionTime = metav1.Time{}, metav1.Time{}
		}
		return s
	}
	return equality.Semantic.DeepEqual(strip(a), strip(b))
}

// writeStatus writes a Deployment's status subresource, once more on a
// conflict with a fresh copy.
func (r *Runner) writeStatus(ctx context.Context, w statusWrite) error {
	obj := w.obj.DeepCopy()
	obj.Status = w.status
	api := r.cs.AppsV1().Deployments(obj.Namespace)
	_, err := api.UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	if !apierrors.IsConflict(err) {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	fresh, err := api.Get(ctx, obj.Name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if fresh.UID != obj.UID || fresh.Generation != obj.Generation {
		return nil // the next sync works on the new spec
	}
	fresh.Status = w.status
	_, err = api.UpdateStatus(ctx, fresh, metav1.UpdateOptions{})
	return err
}

// Kill sends SIGKILL to a replica's process, as a crash would, and returns its
// pid; the runner restarts it like any crashed replica. index is the position
// of the replica among the Deployment's current replicas (0 = lowest slot), as
// listed by Pods.
func (r *Runner) Kill(namespace, deployment string, index int) (int, error) {
	r.mu.Lock()
	st := r.deps[namespace+"/"+deployment]
	if st == nil {
		r.mu.Unlock()
		return 0, fmt.Errorf("no deployment %s/%s is run here", namespace, deployment)
	}
	if index < 0 || index >= len(st.replicas) {
		n := len(st.replicas)
		r.mu.Unlock()
		return 0, fmt.Errorf("deployment %s/%s has %d replicas: no index %d", namespace, deployment, n, index)
	}
	rp := st.replicas[index]
	r.mu.Unlock()

	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.proc == nil || rp.proc.exited() {
		return 0, fmt.Errorf("replica %s is not running (%s)", rp.name, rp.phase)
	}
	rp.proc.signal(sigKill)
	r.log.Info("replica killed on request", "pod", rp.namespace+"/"+rp.name, "pid", rp.proc.pid())
	return rp.proc.pid(), nil
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
