package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/time/rate"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

// Finalizer lets the controller close the gates, delete the Redis keys and mark the
// ledger campaign deleted before a FlashSale goes away.
const Finalizer = "flashsale.dev/cleanup"

// Requeue periods.
const (
	// DefaultStatusRefresh is how often a live sale's counts are refreshed and its
	// Redis checked for data loss (well inside the 5 s the loss must be noticed in).
	DefaultStatusRefresh = 2 * time.Second
	waitForReferences    = 10 * time.Second
	// replaceTimeout bounds opening a sale's new connections while its old
	// ones still work (a Secret or the spec changed).
	replaceTimeout = 5 * time.Second
	retryUnhealthy = 3 * time.Second
	// conflictRetry is the first wait before a reconcile whose status write
	// met a newer version of the sale runs again: the cache is usually a few
	// milliseconds behind a status written just before. It doubles with each
	// conflict in a row, per sale, up to maxFailureBackoff (conflictBackoff).
	conflictRetry = 100 * time.Millisecond
	idleRefresh   = 5 * time.Minute
	// scheduledRefresh is the refresh of a sale that has not started: nothing
	// can be sold, a GitOps pipeline may hold many such sales for days, and
	// the start's own requeue comes at the edge (where a data loss found
	// first is rebuilt before the shards open).
	scheduledRefresh = 10 * time.Second
	// DefaultPhaseTimeout bounds each phase of a reconcile but a rebuild
	// (--phase-timeout): far above the few small queries of a status refresh.
	DefaultPhaseTimeout = 30 * time.Second
	// DefaultCountsStamp is how often status.countsObservedAt is renewed
	// while the counts do not change: often enough to tell stale counts, and
	// one status write a minute for a quiet sale.
	DefaultCountsStamp = time.Minute
)

// FlashSaleReconciler reconciles FlashSale objects.
type FlashSaleReconciler struct {
	client.Client
	Recorder      events.EventRecorder
	Clock         func() time.Time
	Image         string        // image of the reserve and sweeper pods
	StatusRefresh time.Duration // while a sale is live
	PhaseTimeout  time.Duration // DefaultPhaseTimeout when 0
	CountsStamp   time.Duration // DefaultCountsStamp when 0
	// Install names this operator install by its leader election Lease
	// (namespace/name) in the sales it manages (AnnotationOperator); empty,
	// it claims none, and manages every sale no live install owns.
	Install    string
	OwnerStale time.Duration // DefaultOwnerStale when 0

	conns connections
	locks saleLocks
	noops noopWrites
	// apiReader reads past the cache: objects the cache does not hold (a
	// child that lost its labels, one that is not ours).
	apiReader client.Reader
	secrets   *secretReader
	// rebuilds run off the reconcile; rebuildEnded queues a reconcile of a
	// sale whose rebuild ended. rebuildFailpoint, set by tests, runs before
	// each shard of a rebuild is finished; rebuildBegunFailpoint once its
	// start is recorded, before it touches a shard; rebuildStoppedFailpoint
	// when one is stopped.
	rebuilds                rebuilds
	rebuildEnded            chan ctrlevent.GenericEvent
	rebuildFailpoint        func(namespace, name string, shard int)
	rebuildBegunFailpoint   func(namespace, name string)
	rebuildStoppedFailpoint func(namespace, name string)
	// conflicts backs off, per sale, the retries of status writes that
	// conflict again and again (another writer in a hot loop); a status
	// written resets it.
	conflicts     workqueue.TypedRateLimiter[reconcile.Request]
	conflictsOnce sync.Once
	// conflictsTold: the sales (UID and owner) another install manages that
	// this one said so for, once each.
	conflictsTold sync.Map
	// leasesSeen: the owners' Leases as this install last saw them change
	// (ownerLive).
	leasesSeen sync.Map
}

// Reconcile drives one FlashSale toward its spec. It never writes the spec.
func (r *FlashSaleReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	defer r.locks.lock(req.NamespacedName)()
	fs := &flashsalev1alpha1.FlashSale{}
	if err := r.Get(ctx, req.NamespacedName, fs); err != nil {
		if apierrors.IsNotFound(err) {
			r.conns.drop(req.NamespacedName)
			r.noops.forget(req.NamespacedName)
			r.conflictBackoff().Forget(req)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if mine, res, err := r.claim(ctx, fs); !mine {
		return res, err
	}
	if !fs.DeletionTimestamp.IsZero() {
		err := r.finalize(ctx, fs)
		// A conflict is another writer's update, retried at once; a cancel
		// is the manager stopping.
		if err != nil && !errors.Is(err, context.Canceled) && !apierrors.IsConflict(err) {
			// Otherwise the sale only sits in Terminating, and why is in the
			// manager's log alone.
			r.recordEvent(ctx, fs, nil, corev1.EventTypeWarning, ReasonCleanupFailed, "Cleanup",
				"the sale's cleanup failed and is retried: "+err.Error())
			r.reportDeleting(ctx, fs, err)
		}
		return ctrl.Result{}, err
	}
	if err := r.setFinalizer(ctx, fs, true); err != nil {
		return ctrl.Result{}, err
	}

	before := fs.DeepCopy()
	s := &scope{fs: fs, now: r.now()}
	s.window = saleWindow(&fs.Spec, s.now)
	// The phases stop short of the reconcile's deadline (--reconcile-timeout),
	// and the status is written on a context of its own: a hung ledger query
	// must end in a status that says so, not in a write that times out too.
	pctx, cancel := phaseContext(ctx)
	defer cancel()
	s.completed, s.err = r.reconcilePhases(pctx, s)
	if pods, serr := r.reservePods(pctx, fs); serr != nil && s.err == nil {
		s.err = serr
	} else if serr == nil {
		s.reservePods = &pods
	}
	if rp, perr := r.readReplicaPods(pctx, fs); perr != nil && s.err == nil {
		s.err = perr
	} else if perr == nil {
		s.replicas = rp
		// Degraded clears with time too: look again when a crash found
		// stops counting, though nothing else changes (a sale Completed
		// refreshes every 5 minutes only).
		if at := crashesChange(findCrashes(rp.pods, rp.at)); !at.IsZero() {
			s.requeueAfter(at.Sub(rp.at) + time.Second)
		}
	}
	fs.Status = computeStatus(fs, &s.facts, r.countsStamp())
	if s.conn != nil {
		s.conn.noteLedger(fs, &s.facts)
	}
	err := s.err
	if errors.Is(ctx.Err(), context.Canceled) {
		// The manager is stopping (or lost its lease): what the cut phases
		// found is not news, and another manager may be writing already.
		return ctrl.Result{}, err
	}
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), statusWriteTime)
	defer wcancel()
	if werr := r.writeStatus(wctx, before, s); werr != nil {
		if apierrors.IsConflict(werr) && err == nil {
			// Not an error: the sale changed since it was read (most often
			// the cache has not caught up with a status write yet). The
			// next reconcile reads it again and computes the status anew
			// from Redis and the ledger, which hold what this one did.
			after := r.conflictBackoff().When(req)
			log.FromContext(ctx).Info("the sale changed since it was read; reconciling again", "after", after)
			return ctrl.Result{RequeueAfter: after}, nil
		}
		return ctrl.Result{}, errors.Join(err, werr)
	}
	r.conflictBackoff().Forget(req)
	return s.result, err
}

// conflictBackoff is the per-sale backoff of status writes that conflict:
// conflictRetry, doubled with each conflict in a row, at most
// maxFailureBackoff.
func (r *FlashSaleReconciler) conflictBackoff() workqueue.TypedRateLimiter[reconcile.Request] {
	r.conflictsOnce.Do(func() {
		r.conflicts = workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](conflictRetry, maxFailureBackoff)
	})
	return r.conflicts
}

// statusWriteTime is what a reconcile keeps of its deadline for writing the
// status.
const statusWriteTime = 15 * time.Second

// phaseContext is ctx with its deadline, if any, moved earlier by what the
// status write needs (at most a quarter of the time left).
func phaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, dl.Add(-min(statusWriteTime, time.Until(dl)/4)))
}

// reconcilePhases runs the phases in order until one is done early (it set a
// condition and a requeue) or fails; completed reports that every phase ran.
//
// Each phase is bounded by PhaseTimeout, except a rebuild (it streams every
// pending order and buyer): a Redis or ledger that hangs shows as unreachable within it
// instead of at the reconcile's deadline, and the next reconcile, which
// closes the shards first when the spec asks for it, comes that much sooner.
func (r *FlashSaleReconciler) reconcilePhases(ctx context.Context, s *scope) (completed bool, err error) {
	for _, phase := range []struct {
		run       func(context.Context, *scope) (bool, error)
		unbounded bool // bounds itself
	}{
		{run: r.connect},
		{run: r.closeFirst},
		{run: r.ensureStock, unbounded: true},
		{run: r.applyAllocation},
		{run: r.applyGates},
		{run: r.reconcileChildren},
		{run: r.observe},
	} {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if !phase.unbounded {
			pctx, cancel = context.WithTimeout(ctx, r.phaseTimeout())
		}
		done, err := phase.run(pctx, s)
		cancel()
		if err != nil || done {
			return false, err
		}
	}
	return true, nil
}

func (r *FlashSaleReconciler) phaseTimeout() time.Duration {
	if r.PhaseTimeout > 0 {
		return r.PhaseTimeout
	}
	return DefaultPhaseTimeout
}

func (r *FlashSaleReconciler) now() time.Time {
	if r.Clock != nil {
		return r.Clock()
	}
	return time.Now()
}

func (r *FlashSaleReconciler) countsStamp() time.Duration {
	if r.CountsStamp > 0 {
		return r.CountsStamp
	}
	return DefaultCountsStamp
}

func (r *FlashSaleReconciler) statusRefresh() time.Duration {
	if r.StatusRefresh > 0 {
		return r.StatusRefresh
	}
	return DefaultStatusRefresh
}

// SetupWithManager registers the controller: FlashSales, their children, the
// children's pods (their crashes), and the Secrets they reference (a Secret
// created after its FlashSale unblocks it).
// The manager should be made with CacheOptions and ClientOptions.
func (r *FlashSaleReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.apiReader = mgr.GetAPIReader()
	r.secrets = newSecretReader(mgr.GetCache(), mgr.GetAPIReader())
	r.rebuildEnded = make(chan ctrlevent.GenericEvent, 64)
	if err := mgr.Add(manager.RunnableFunc(r.stopRebuilds)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		// Not on its own status writes: while the counts move, each write
		// would start the next reconcile at once, and --status-refresh would
		// bound nothing. Deletion bumps the generation.
		For(&flashsalev1alpha1.FlashSale{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		// Not on status: the disruption controller rewrites it as pods come
		// and go, which tells this controller nothing.
		Owns(&policyv1.PodDisruptionBudget{}, builder.WithPredicates(
			predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.salesUsingSecret)).
		// The reserve and sweeper pods, for Degraded: a restart, a back-off.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(salesOfPod), builder.WithPredicates(podCrashChanged)).
		WatchesRawSource(source.Channel(r.rebuildEnded, &handler.EnqueueRequestForObject{})).
		Named("flashsale").
		WithOptions(controller.Options{RateLimiter: failureRateLimiter()}).
		Complete(r)
}

// maxFailureBackoff bounds the wait before a failed reconcile is retried. A
// failed reconcile loses its requeue for the schedule's next edge, and the
// default backoff grows to 16 minutes: a status write failing a few times in
// a row (an API server restarting) would make the sale open or close that late.
const maxFailureBackoff = 10 * time.Second

// failureRateLimiter is controller-runtime's default with its per-sale
// backoff bounded by maxFailureBackoff.
func failureRateLimiter() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, maxFailureBackoff),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

func (r *FlashSaleReconciler) salesUsingSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var list flashsalev1alpha1.FlashSaleList
	if err := r.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		log.FromContext(ctx).Error(err, "listing FlashSales for a Secret change")
		return nil
	}
	var out []reconcile.Request
	for _, fs := range list.Items {
		sp := fs.Spec
		if n := o.GetName(); n == sp.Redis.SecretRef.Name || n == sp.Postgres.SecretRef.Name || n == sp.Admission.SecretRef.Name {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: fs.Namespace, Name: fs.Name}})
		}
	}
	return out
}
