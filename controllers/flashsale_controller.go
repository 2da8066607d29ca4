package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
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
	// conflictRetry is the wait before a reconcile whose status write met a
	// newer version of the sale runs again: the cache is usually a few
	// milliseconds behind.
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

	conns connections
	// apiReader reads past the cache: objects the cache does not hold (a
	// child that lost its labels, one that is not ours).
	apiReader client.Reader
	secrets   *secretReader
	// staleReads counts, per sale, the reconciles in a row whose status
	// read was older than the stored one (*atomic.Int32).
	staleReads sync.Map
}

// scope is what the phases of one reconcile share.
type scope struct {
	fs     *flashsalev1alpha1.FlashSale
	now    time.Time
	window window
	conn   *campaignConn
	epoch  int64
	counts engine.Counts
	events []event // emitted after the status write succeeded
	result ctrl.Result
	// notReady, when set, is what Ready says at the end of the reconcile,
	// whatever the later phases found: a problem that does not stop them (a
	// Secret gone while the sale's connections still work, a child that cannot
	// be written).
	notReady *metav1.Condition
	// incomplete: a phase could not apply part of the spec although the
	// reconcile went on; observedGeneration stays where it was.
	incomplete bool
	// refs are the referenced Secrets' values when they could all be read.
	refs *references
	// ledgerDown: a phase stopped because the ledger failed.
	ledgerDown bool
	// closed is the closing gate every shard holds, when this reconcile
	// wrote it ahead of the ledger phases (closeFirst).
	closed string
	// unbounded is the reconcile's context without the phase bound, for
	// the rebuild.
	unbounded context.Context
}

func (s *scope) setNotReady(reason, message string) {
	s.notReady = &metav1.Condition{Reason: reason, Message: message}
}

type event struct {
	kind, reason, message string
	// fromStatus: decided by comparing with the status the reconcile read
	// (a phase change, a condition that starts failing), not by something
	// it did. Such an event is not sent when that status turns out stale.
	fromStatus bool
}

// event records what the reconcile did, sent once the status is written.
func (s *scope) event(kind, reason, format string, args ...any) {
	s.events = append(s.events, event{kind: kind, reason: reason, message: fmt.Sprintf(format, args...)})
}

// statusEvent records a change found against the status the reconcile read.
func (s *scope) statusEvent(kind, reason, format string, args ...any) {
	s.events = append(s.events, event{kind: kind, reason: reason, message: fmt.Sprintf(format, args...), fromStatus: true})
}

func (s *scope) condition(typ string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&s.fs.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: message, ObservedGeneration: s.fs.Generation,
	})
}

// requeueAfter keeps the earliest requested requeue.
func (s *scope) requeueAfter(d time.Duration) {
	if d > 0 && (s.result.RequeueAfter == 0 || d < s.result.RequeueAfter) {
		s.result.RequeueAfter = d
	}
}

// Reconcile drives one FlashSale toward its spec. It never writes the spec.
func (r *FlashSaleReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	fs := &flashsalev1alpha1.FlashSale{}
	if err := r.Get(ctx, req.NamespacedName, fs); err != nil {
		if apierrors.IsNotFound(err) {
			r.conns.drop(req.NamespacedName)
			r.staleReads.Delete(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if !fs.DeletionTimestamp.IsZero() {
		err := r.finalize(ctx, fs)
		// A conflict is another writer's update, retried at once; a cancel
		// is the manager stopping.
		if err != nil && !errors.Is(err, context.Canceled) && !apierrors.IsConflict(err) {
			// Otherwise the sale only sits in Terminating, and why is in the
			// manager's log alone.
			r.Recorder.Eventf(fs, nil, corev1.EventTypeWarning, ReasonCleanupFailed, "Cleanup",
				"%s", truncate("the sale's cleanup failed and is retried: "+err.Error(), eventNoteLimit))
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
	completed, err := r.reconcilePhases(pctx, s)
	if s.ledgerDown && s.conn == nil && s.refs != nil {
		// The connections did not open because the ledger did not: close
		// through Redis alone.
		store, done := redisOnly(s.fs, s.refs)
		s.closed = r.closeShards(ctx, s, store)
		done()
	}
	if !completed && s.closed != "" {
		// observe did not run: the phase says what the shards hold.
		s.fs.Status.Phase = closedPhase(s.closed, s.fs.Status.Phase)
	}
	if serr := r.reportReservePods(pctx, fs); serr != nil && err == nil {
		err = serr
	}
	if p := s.notReady; p != nil {
		s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, p.Reason, p.Message)
	}
	// Only a reconcile that went through every phase has applied this spec.
	if err == nil && completed && !s.incomplete {
		fs.Status.ObservedGeneration = fs.Generation
	}
	keepTransitionTimes(before.Status.Conditions, fs.Status.Conditions)
	if errors.Is(ctx.Err(), context.Canceled) {
		// The manager is stopping (or lost its lease): what the cut phases
		// found is not news, and another manager may be writing already.
		return ctrl.Result{}, err
	}
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), statusWriteTime)
	defer wcancel()
	if werr := r.writeStatus(wctx, before, s); werr != nil {
		if errors.Is(werr, errStaleStatus) && err == nil {
			// Not an error: the cache has not caught up with a write yet. A
			// cache that stays behind gets retries further apart.
			n, _ := r.staleReads.LoadOrStore(req.NamespacedName, new(atomic.Int32))
			after := min(conflictRetry<<min(n.(*atomic.Int32).Add(1)-1, 8), r.statusRefresh())
			log.FromContext(ctx).Info("status read from a copy older than the stored one; reconciling again", "after", after)
			return ctrl.Result{RequeueAfter: after}, nil
		}
		return ctrl.Result{}, errors.Join(err, werr)
	}
	r.staleReads.Delete(req.NamespacedName)
	return s.result, err
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

// keepTransitionTimes gives back the stored lastTransitionTime of every
// condition that ends the reconcile with the status it started with: a phase
// may set a condition one way and a later phase the other (the ledger answers,
// then it turns out not to know the sale), and only the final status counts.
func keepTransitionTimes(before, after []metav1.Condition) {
	for i := range after {
		if old := meta.FindStatusCondition(before, after[i].Type); old != nil && old.Status == after[i].Status {
			after[i].LastTransitionTime = old.LastTransitionTime
		}
	}
}

// reconcilePhases runs the phases in order until one is done early (it set a
// condition and a requeue) or fails; completed reports that every phase ran.
//
// Each phase is bounded by PhaseTimeout, except a rebuild (it streams every
// pending order and buyer): a Redis or ledger that hangs shows as unreachable within it
// instead of at the reconcile's deadline, and the next reconcile, which
// closes the shards first when the spec asks for it, comes that much sooner.
func (r *FlashSaleReconciler) reconcilePhases(ctx context.Context, s *scope) (completed bool, err error) {
	s.unbounded = ctx
	for _, phase := range []func(context.Context, *scope) (bool, error){
		r.connect,
		r.closeFirst,
		r.ensureStock,
		r.applyAllocation,
		r.applyGates,
		r.reconcileChildren,
		r.observe,
	} {
		pctx, cancel := context.WithTimeout(ctx, r.phaseTimeout())
		done, err := phase(pctx, s)
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

// connect reads the referenced Secrets and opens (or reuses) the Redis and ledger
// connections. A missing Secret or key stops here with a condition naming it,
// unless the sale's connections are already open: a Secret deleted or broken
// during the sale (a rotation by delete and recreate, a GitOps prune) must not
// stop the pause switch and the schedule's end from closing it.
func (r *FlashSaleReconciler) connect(ctx context.Context, s *scope) (bool, error) {
	refs, err := readReferences(ctx, r.secrets, s.fs)
	var refErr *referenceError
	if errors.As(err, &refErr) {
		s.requeueAfter(waitForReferences)
		c := r.conns.cached(types.NamespacedName{Namespace: s.fs.Namespace, Name: s.fs.Name})
		if c != nil && c.engine.Config().CampaignID == string(s.fs.UID) {
			s.conn = c
			s.setNotReady(refErr.reason, refErr.message+" (the sale is still served and gated with the connections opened before)")
			s.incomplete = true // the spec's Secrets are not what these connections use
			return false, nil
		}
		s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, refErr.reason, refErr.message)
		// Nothing else was checked (an operator restarted while a Secret is
		// gone): what these said before is not known to hold any more.
		for _, typ := range []string{flashsalev1alpha1.ConditionAdmitting, flashsalev1alpha1.ConditionRedisHealthy, flashsalev1alpha1.ConditionLedgerHealthy} {
			if meta.FindStatusCondition(s.fs.Status.Conditions, typ) != nil {
				s.condition(typ, metav1.ConditionUnknown, refErr.reason, "not checked: "+refErr.message)
			}
		}
		return true, nil
	}
	if err != nil {
		return true, err
	}
	s.refs = &refs
	set := resolve(s.fs)
	cfg := engine.Config{
		CampaignID: string(s.fs.UID), Namespace: s.fs.Namespace, Name: s.fs.Name, SKU: s.fs.Spec.SKU,
		Allocation: s.fs.Spec.Allocation, Shards: int(set.shards), MaxPerUser: int(set.maxPerUser),
		TTL: set.ttl, Grace: set.grace, StealProbes: int(set.stealProbes),
		IDSecret: config.DeriveIDSecret(refs.admissionKey),
	}
	name := types.NamespacedName{Namespace: s.fs.Namespace, Name: s.fs.Name}
	gctx := ctx
	prev := r.conns.cached(name)
	if prev != nil && prev.engine.Config().CampaignID != string(s.fs.UID) {
		prev = nil // a sale of the same name, deleted since
	}
	if prev != nil {
		// Replacing connections that work: a new ledger or Redis that does
		// not answer must not delay the gates applied with the old ones.
		var cancel context.CancelFunc
		gctx, cancel = context.WithTimeout(ctx, replaceTimeout)
		defer cancel()
	}
	conn, err := r.conns.get(gctx, name, refs, cfg)
	if err != nil && prev != nil {
		// Secrets changed to values that do not connect (a rotation to a
		// wrong DSN): as with a Secret gone, the sale goes on being gated
		// and observed with the connections opened before. Their health is
		// what the phases below find; only Ready says what is wrong here.
		f := describeFailure(s.fs, err)
		secret := fmt.Sprintf("Redis Secret %q", s.fs.Spec.Redis.SecretRef.Name)
		if f.condition == flashsalev1alpha1.ConditionLedgerHealthy {
			secret = fmt.Sprintf("ledger Secret %q", s.fs.Spec.Postgres.SecretRef.Name)
		}
		s.setNotReady(f.readyReason, "new connections, for the current values of the "+secret+" or a changed spec, do not open: "+f.message+
			" (the sale is still served and gated with the connections opened before)")
		s.refs = nil // the pods are not rolled onto values that do not connect
		s.incomplete = true
		s.conn = prev
		s.requeueAfter(retryUnhealthy)
		return false, nil
	}
	if err != nil {
		r.unhealthy(s, err)
		return true, nil
	}
	s.conn = conn
	// A new connection reached the ledger. A cached one is asked when the
	// ledger was last found down: the phases below may stop at Redis before
	// any ledger query, and the recovery would not show until Redis is back.
	if conn != prev || (ledgerUnreachable(s.fs) && pingLedger(ctx, conn) == nil) {
		s.condition(flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue, ReasonReachable, "PostgreSQL answers")
	}
	return false, nil
}

// unhealthy records a Redis or ledger failure: the sale is closed (no reservation
// can be made durable or taken) and the controller retries soon.
func (r *FlashSaleReconciler) unhealthy(s *scope, err error) {
	f := describeFailure(s.fs, err)
	s.ledgerDown = s.ledgerDown || f.condition == flashsalev1alpha1.ConditionLedgerHealthy
	s.condition(f.condition, metav1.ConditionFalse, f.reason, f.message)
	s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, f.readyReason, f.message)
	s.condition(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonUnhealthy, "reservations cannot be taken: "+err.Error())
	s.requeueAfter(retryUnhealthy)
}

// closeTimeout bounds a closing gate written ahead of the ledger phases.
const closeTimeout = 5 * time.Second

// closingContext bounds a closing gate write by closeTimeout, whatever is
// left of ctx: the reconcile's may be spent on a hung ledger.
func closingContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
}

// redisOnly is the sale's Store on a Redis client of its own, for closing
// the sale when its connections did not open because the ledger did not;
// done closes the client.
func redisOnly(fs *flashsalev1alpha1.FlashSale, refs *references) (store *stock.Store, done func()) {
	rdb := refs.redis.Client()
	return stock.New(rdb, string(fs.UID), int(resolve(fs).shards)), func() { _ = rdb.Close() }
}

// closeFirst writes the closing gate the spec asks for (paused, ended, not
// yet started) before any phase that needs the ledger. Closing needs only
// Redis, and a ledger that hangs or refuses the operator while the reserve
// pods may still reach it (a partition of the operator, its connections
// refused by a full PostgreSQL) must not keep a paused or ended sale
// selling. Opening waits for the ledger (applyGates).
func (r *FlashSaleReconciler) closeFirst(ctx context.Context, s *scope) (bool, error) {
	s.closed = r.closeShards(ctx, s, s.conn.engine.Store())
	return false, nil
}

// closeShards writes the spec's closing gate on every shard that is OPEN
// (shards closed otherwise keep their state: failed closed, or a gate the
// schedule has moved past, which applyGates writes once the ledger answers),
// and returns the gate when every shard is known to hold it. A shard being
// rebuilt is left to the rebuild, which opens it in the gate of its moment.
func (r *FlashSaleReconciler) closeShards(ctx context.Context, s *scope, store *stock.Store) string {
	gate := saleWindow(&s.fs.Spec, r.now()).Gate
	if gate == stock.StateOpen {
		return ""
	}
	// The read has a context of its own: one that hangs must not spend the
	// write's time.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout/2)
	states, err := store.State(rctx)
	rcancel()
	ctx, cancel := closingContext(ctx)
	defer cancel()
	// others: every shard that is not OPEN holds the gate already. Not known
	// when the state could not be read.
	open, others := false, err == nil
	for _, st := range states {
		switch {
		case st.State == stock.StateOpen:
			open = true
		case st.State != gate:
			others = false
		}
	}
	if err == nil && !open {
		if others {
			return gate
		}
		return ""
	}
	// Any epoch: closing is right whoever seeded or rebuilt the shard.
	out, err := store.CloseOpen(ctx, gate)
	if err != nil {
		log.FromContext(ctx).Error(err, "closing the sale", "gate", gate)
		return ""
	}
	if i := slices.IndexFunc(out, func(n int) bool { return n != stock.GateSet }); i >= 0 {
		log.FromContext(ctx).Info("a shard was not closed (no meta, or being rebuilt)", "gate", gate, "shard", i, "outcome", out[i])
		return ""
	}
	s.event(corev1.EventTypeNormal, ReasonGateChanged, "Gate set to %s on every open shard", gate)
	if !others {
		return ""
	}
	return gate
}

// closedPhase is the phase of shards closed by gate when observe could not
// run: not Completed (that needs the counts) unless it was already, and a
// failed-closed sale stays so until it is rebuilt.
func closedPhase(gate string, cur flashsalev1alpha1.FlashSalePhase) flashsalev1alpha1.FlashSalePhase {
	switch {
	case cur == flashsalev1alpha1.PhaseFailClosed || cur == flashsalev1alpha1.PhaseRebuilding:
		return cur
	case gate == stock.StatePaused:
		return flashsalev1alpha1.PhasePaused
	case gate == stock.StateNotStarted:
		return flashsalev1alpha1.PhaseScheduled
	case cur == flashsalev1alpha1.PhaseCompleted:
		return cur
	}
	return flashsalev1alpha1.PhaseEnded
}

// failure is what a Redis or ledger error says in the status: the health
// condition it turns False, with its reason, and Ready's reason.
type failure struct {
	condition, reason, readyReason, message string
}

func describeFailure(fs *flashsalev1alpha1.FlashSale, err error) failure {
	var le *ledgerError
	onLedger := func(reason, readyReason, message string) failure {
		return failure{flashsalev1alpha1.ConditionLedgerHealthy, reason, readyReason, message}
	}
	onRedis := func(reason, readyReason string) failure {
		return failure{flashsalev1alpha1.ConditionRedisHealthy, reason, readyReason, err.Error()}
	}
	switch {
	case errors.As(err, &le) && errors.Is(err, ledger.ErrBadDSN):
		return onLedger(ReasonInvalid, ReasonLedgerSecretInvalid,
			fmt.Sprintf("ledger Secret %q key %q: %s", fs.Spec.Postgres.SecretRef.Name, resolve(fs).postgresKey, le.err.Error()))
	case errors.As(err, &le) && pgForbidden(err):
		return onLedger(ReasonForbidden, ReasonLedgerForbidden, "PostgreSQL ledger refused the operator: "+le.err.Error())
	case errors.As(err, &le):
		return onLedger(ReasonUnreachable, ReasonLedgerUnreachable, err.Error())
	case errors.Is(err, stock.ErrEvictionPolicy):
		return onRedis(ReasonEvictionPolicy, ReasonRedisEvictionPolicy)
	case errors.Is(err, stock.ErrRedisTooOld):
		return onRedis(ReasonUnsupported, ReasonRedisUnsupported)
	case redis.IsAuthError(err) || redis.IsPermissionError(err):
		// Wrong credentials, or an ACL user without a command the operator needs.
		return onRedis(ReasonForbidden, ReasonRedisForbidden)
	}
	return onRedis(ReasonUnreachable, ReasonRedisUnreachable)
}

// ensureStock seeds a new sale once, and detects and repairs Redis data loss: shards
// without meta, a stale epoch, or a Redis server that restarted. Loss first shows
// as FailClosed (every shard refuses), then the next reconcile rebuilds from the
// ledger.
func (r *FlashSaleReconciler) ensureStock(ctx context.Context, s *scope) (bool, error) {
	eng := s.conn.engine
	lost, why := false, ""
	// firstSeed: the sale never showed as seeded. Shards missing then are most
	// likely a first seeding cut short (an operator restart, a Redis refusal
	// fixed since): they are written from the ledger as a rebuild would, and
	// reported as data loss only if the ledger shows the sale had taken
	// reservations.
	firstSeed := false
	res, err := eng.SeedSale(ctx, s.window.Gate, s.fs.Status.Epoch > 0)
	switch {
	case errors.Is(err, engine.ErrNeedsRebuild):
		lost, why = true, err.Error()
		firstSeed = s.fs.Status.Epoch == 0 && !meta.IsStatusConditionTrue(s.fs.Status.Conditions, flashsalev1alpha1.ConditionSeeded)
	case errors.Is(err, engine.ErrLedgerMismatch):
		// Neither seeded nor rebuilt: either would trust a ledger that does
		// not hold what was sold. Pods writing to it are fenced (no campaign).
		if c := meta.FindStatusCondition(s.fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c == nil || c.Reason != ReasonLedgerMismatch {
			s.statusEvent(corev1.EventTypeWarning, ReasonLedgerMismatch, "%s", err.Error())
		}
		s.condition(flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse, ReasonMismatch, err.Error())
		s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, ReasonLedgerMismatch, err.Error())
		s.condition(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonUnhealthy, "reservations cannot be recorded: "+err.Error())
		s.requeueAfter(retryUnhealthy)
		return true, nil
	case err != nil:
		r.unhealthy(s, classify(err))
		return true, nil
	}
	s.epoch = res.Campaign.Epoch
	if res.Seeded > 0 {
		s.event(corev1.EventTypeNormal, ReasonSeeded, "Seeded %d units into %d Redis shards (epoch %d)", res.Campaign.Allocation, res.Seeded, res.Campaign.Epoch)
	}
	srv, err := eng.Store().Servers(ctx)
	if err != nil {
		r.unhealthy(s, err)
		return true, nil
	}
	ids := srv.RunIDs
	if !lost {
		why, lost = s.conn.runIDsChanged(s.fs.Status.RedisServers, ids)
	}
	phase := s.fs.Status.Phase
	if !lost && s.conn.rebuiltEpoch == res.Campaign.Epoch && s.conn.rebuiltEpoch > 0 &&
		(phase == flashsalev1alpha1.PhaseFailClosed || phase == flashsalev1alpha1.PhaseRebuilding) {
		// This connection rebuilt the shards at the ledger's epoch and nothing
		// is lost since: the phase read is older than that rebuild's status
		// write (a cache that has not caught up), not a reason to rebuild again.
		phase = ""
	}
	needsRebuild := lost || phase == flashsalev1alpha1.PhaseFailClosed || phase == flashsalev1alpha1.PhaseRebuilding
	if needsRebuild && !firstSeed && phase != flashsalev1alpha1.PhaseFailClosed && phase != flashsalev1alpha1.PhaseRebuilding {
		// Close every shard at once (shards without meta already refuse), say so, and
		// rebuild on the next reconcile, right after this status is written.
		// On a context of its own: a slow ledger may have spent the phase's.
		cctx, cancel := closingContext(ctx)
		_, _ = eng.Store().SetGate(cctx, stock.StateFailClosed, 0)
		cancel()
		s.fs.Status.Phase = flashsalev1alpha1.PhaseFailClosed
		msg := "Redis lost the sale's state (" + why + "); every shard refuses reservations until the stock is rebuilt from the ledger"
		s.condition(flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse, ReasonRedisDataLost, msg)
		s.condition(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonFailClosed, msg)
		s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, ReasonFailClosed, msg)
		// Found against the status read (its phase, its servers' run ids):
		// a stale read finds the same loss again and must not say it twice.
		s.statusEvent(corev1.EventTypeWarning, ReasonRedisDataLost, "%s", msg)
		s.result.RequeueAfter = time.Millisecond
		return true, nil
	}
	if needsRebuild {
		// The shards open in the state of the moment they open (applyGates
		// recomputes the window too): a rebuild of a large ledger may run
		// across a schedule edge.
		// Not bounded by the phase: a rebuild reads every live order.
		rep, err := eng.Rebuild(s.unbounded, func() string { return saleWindow(&s.fs.Spec, r.now()).Gate })
		if err != nil {
			err = classify(err)
			msg := "rebuild from the ledger failed, the sale stays closed: " + err.Error()
			s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, ReasonRebuildFailed, msg)
			s.condition(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonFailClosed, msg)
			var le *ledgerError
			if errors.As(err, &le) {
				s.ledgerDown = true
				s.condition(flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse, ReasonUnreachable, err.Error())
			} else {
				s.fs.Status.Phase = flashsalev1alpha1.PhaseRebuilding
			}
			s.event(corev1.EventTypeWarning, ReasonRebuildFailed, "%s", msg)
			s.requeueAfter(retryUnhealthy)
			return true, nil
		}
		// The rest of the phase gets a bound of its own: the rebuild may
		// have outlasted the phase's.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(s.unbounded, r.phaseTimeout())
		defer cancel()
		s.epoch = rep.Epoch
		s.conn.rebuiltEpoch = rep.Epoch
		s.fs.Status.Phase = salePhase(rep.Gate, rep.Available, rep.Reserved)
		if firstSeed && rep.Reserved == 0 && rep.Sold == 0 {
			s.event(corev1.EventTypeNormal, ReasonSeeded, "Seeded %d units into %d Redis shards (epoch %d), completing a first seeding that was cut short (%s)",
				s.fs.Spec.Allocation, resolve(s.fs).shards, rep.Epoch, why)
			return r.afterSeed(ctx, s, ids, srv)
		}
		if firstSeed {
			s.event(corev1.EventTypeWarning, ReasonRedisDataLost, "Redis lost the sale's state (%s) before the operator recorded it as seeded; rebuilt from the ledger", why)
		}
		s.fs.Status.LastRebuild = &flashsalev1alpha1.RebuildStatus{
			Time: metav1.NewTime(s.now), Reason: truncate(why, 256),
			Available: rep.Available, Reserved: rep.Reserved, Sold: rep.Sold, RestoredOrders: rep.Restored,
			DurationSeconds: fmt.Sprintf("%.3f", rep.Duration.Seconds()),
		}
		if why == "" {
			s.fs.Status.LastRebuild.Reason = "resumed after the sale failed closed"
		}
		// The phase above is what the rebuilt shards say, until observe
		// recomputes it: a later phase that stops early must not leave it blank.
		s.event(corev1.EventTypeNormal, ReasonRebuilt, "Rebuilt the stock from the ledger in %s: epoch %d, available %d, reserved %d, sold %d; %d pending orders restored",
			rep.Duration.Round(time.Millisecond), rep.Epoch, rep.Available, rep.Reserved, rep.Sold, rep.Restored)
	}
	return r.afterSeed(ctx, s, ids, srv)
}

// afterSeed records the Redis servers that hold the verified shards, stamps
// shards seeded before metas recorded their server, and reports Redis health.
func (r *FlashSaleReconciler) afterSeed(ctx context.Context, s *scope, ids map[string]string, srv stock.ServerCheck) (bool, error) {
	eng := s.conn.engine
	s.conn.rememberRunIDs(ids)
	s.fs.Status.RedisServers = redisServers(ids)
	// Shards seeded before metas recorded their server get it now, verified.
	if _, err := eng.Store().Stamp(ctx); err != nil {
		r.unhealthy(s, err)
		return true, nil
	}
	// A server that may evict keys is reported, and the sale goes on being
	// gated and observed: only seeding and rebuilding are refused on it.
	if err := srv.Evicting; err != nil {
		if c := meta.FindStatusCondition(s.fs.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy); c == nil || c.Reason != ReasonEvictionPolicy {
			s.statusEvent(corev1.EventTypeWarning, ReasonRedisEvictionPolicy, "%s", err.Error())
		}
		s.condition(flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse, ReasonEvictionPolicy, err.Error())
		s.setNotReady(ReasonRedisEvictionPolicy, err.Error())
	} else {
		s.condition(flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionTrue, ReasonReachable, fmt.Sprintf("every shard carries epoch %d", s.epoch))
	}
	s.condition(flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue, ReasonSeeded, fmt.Sprintf("ledger campaign and %d shards hold the sale (epoch %d)", resolve(s.fs).shards, s.epoch))
	return false, nil
}

// pgForbidden reports a PostgreSQL refusal of the credentials or of a
// permission: no such role or no pg_hba entry, a wrong password, or a missing
// privilege (the migrations create tables).
func pgForbidden(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "28000" || pe.Code == "28P01" || pe.Code == "42501")
}

// classify turns errors that come from the ledger into ledgerErrors.
func classify(err error) error {
	var le *ledgerError
	if errors.As(err, &le) {
		return err
	}
	if errors.Is(err, engine.ErrLedger) {
		return &ledgerError{err}
	}
	return err
}

// applyAllocation brings the allocation to spec.allocation exactly once: a raise
// adds units (restock); a decrease takes units out of available stock, and is
// refused while it would fall below the units sold and reserved.
func (r *FlashSaleReconciler) applyAllocation(ctx context.Context, s *scope) (bool, error) {
	eng := s.conn.engine
	want := s.fs.Spec.Allocation
	c, err := eng.Ledger().GetCampaign(ctx, string(s.fs.UID))
	if err != nil {
		r.unhealthy(s, &ledgerError{err})
		return true, nil
	}
	s.condition(flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue, ReasonReachable, "PostgreSQL answers")
	// A spec that is refused or still being applied is not observed: the
	// generation stays unobserved until it is in effect.
	refuse := func(sold, reserved int64) {
		msg := fmt.Sprintf("allocation %d refused: %d units are sold and %d reserved; allocation %d stays in effect", want, sold, reserved, c.Allocation)
		// One event per refused spec: the counts in the message change with
		// every reservation.
		if cond := meta.FindStatusCondition(s.fs.Status.Conditions, ConditionAllocationApplied); cond == nil ||
			cond.Reason != ReasonAllocationRefused || cond.ObservedGeneration != s.fs.Generation {
			s.statusEvent(corev1.EventTypeWarning, ReasonAllocationRefused, "%s", msg)
		}
		s.condition(ConditionAllocationApplied, metav1.ConditionFalse, ReasonAllocationRefused, msg)
		s.setNotReady(ReasonAllocationRefused, msg)
		s.incomplete = true
	}
	if want < c.Allocation {
		counts, err := eng.Counts(ctx)
		if err != nil {
			r.unhealthy(s, classify(err))
			return true, nil
		}
		if want < counts.Sold+counts.Reserved {
			// Units withdrawn by an earlier attempt go back to the stock.
			if _, err := eng.ApplyAllocation(ctx, c.Allocation); err != nil {
				r.unhealthy(s, classify(err))
				return true, nil
			}
			refuse(counts.Sold, counts.Reserved)
			return false, nil
		}
	}
	changed, err := eng.ApplyAllocation(ctx, want)
	switch {
	case errors.Is(err, engine.ErrBelowHeld):
		counts, cerr := eng.Counts(ctx)
		if cerr != nil {
			// The refusal is sure; its counts are not: no message with zeros.
			r.unhealthy(s, classify(cerr))
			return true, nil
		}
		refuse(counts.Sold, counts.Reserved)
		return false, nil
	case errors.Is(err, engine.ErrAllocationPending):
		msg := fmt.Sprintf("lowering the allocation to %d: %v; it completes as reserved units are released", want, err)
		s.condition(ConditionAllocationApplied, metav1.ConditionFalse, ReasonAllocationPending, msg)
		// Not Ready either: a pipeline waiting on Ready waits for the change.
		s.setNotReady(ReasonAllocationPending, msg)
		s.incomplete = true
		s.requeueAfter(retryUnhealthy)
		return false, nil
	case errors.Is(err, stock.ErrRebuilt), errors.Is(err, ledger.ErrEpochChanged):
		// A rebuild ran meanwhile (another operator's, during a leadership
		// handover): the change is applied over its result at the next try.
		s.condition(ConditionAllocationApplied, metav1.ConditionFalse, ReasonAllocationRetried,
			fmt.Sprintf("allocation %d: retried after a rebuild of the shards: %v", want, err))
		s.incomplete = true
		s.requeueAfter(retryUnhealthy)
		return false, nil
	case err != nil:
		r.unhealthy(s, classify(err))
		return true, nil
	}
	switch {
	case changed && want > c.Allocation:
		s.event(corev1.EventTypeNormal, ReasonRestocked, "Added %d units: allocation %d → %d", want-c.Allocation, c.Allocation, want)
	case changed && want < c.Allocation:
		s.event(corev1.EventTypeNormal, ReasonAllocationLowered, "Removed %d units from available stock: allocation %d → %d", c.Allocation-want, c.Allocation, want)
	}
	s.condition(ConditionAllocationApplied, metav1.ConditionTrue, ReasonApplied, fmt.Sprintf("allocation %d is in effect", want))
	return false, nil
}

// applyGates writes the gate the schedule and the pause switch ask for into every
// shard whose meta says otherwise.
func (r *FlashSaleReconciler) applyGates(ctx context.Context, s *scope) (bool, error) {
	// The window of now, not of the reconcile's start: the phases before may
	// have waited on a slow ledger across a schedule edge.
	s.now = r.now()
	s.window = saleWindow(&s.fs.Spec, s.now)
	if s.window.Gate != s.closed {
		s.closed = "" // the schedule moved on since closeFirst
	}
	states, err := s.conn.engine.Store().State(ctx)
	if err != nil {
		r.unhealthy(s, err)
		return true, nil
	}
	for _, st := range states {
		if st.State == s.window.Gate {
			continue
		}
		if err := s.conn.engine.SetGate(ctx, s.window.Gate, s.epoch); err != nil {
			r.unhealthy(s, err)
			return true, nil
		}
		if s.window.Gate != stock.StateOpen {
			s.closed = s.window.Gate
		}
		s.event(corev1.EventTypeNormal, ReasonGateChanged, "Gate set to %s on every shard", s.window.Gate)
		break
	}
	if s.window.Next > 0 {
		s.requeueAfter(s.window.Next)
	}
	return false, nil
}

// reconcileChildren creates or updates the reserve Deployment and Service and the
// sweeper Deployment, owned by the FlashSale. They are created ahead of the
// schedule's start so the pods are warm before the drop. A child that cannot be
// written (one that exists and is not ours, an admission policy refusing it) is
// reported in Ready and retried soon, and the reconcile goes on: returning the
// error would put the status refresh and the schedule's next edge on the
// controller's growing error backoff.
func (r *FlashSaleReconciler) reconcileChildren(ctx context.Context, s *scope) (bool, error) {
	failed := func(kind, name string, err error) {
		msg := fmt.Sprintf("cannot write %s %s: %v", kind, name, err)
		// One event when it starts failing: the status changes with every
		// refresh during a sale, so repeats would not fold into one.
		if c := meta.FindStatusCondition(s.fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c == nil || c.Reason != ReasonChildrenFailed {
			s.statusEvent(corev1.EventTypeWarning, ReasonChildrenFailed, "%s", msg)
		}
		s.setNotReady(ReasonChildrenFailed, msg)
		s.requeueAfter(retryUnhealthy)
		s.incomplete = true
	}
	sweeper := SweeperDeployment(s.fs, r.Image)
	deployments := []*appsv1.Deployment{sweeper}
	idKey, err := r.ensureIDSecret(ctx, s)
	if err != nil {
		// The reserve pods need it: their Deployment is left as it is, so that
		// running pods are not replaced by ones that cannot start.
		failed("Secret", ChildName(s.fs, ComponentIDs), err)
	} else {
		reserve := ReserveDeployment(s.fs, r.Image)
		if idKey != nil && s.refs != nil {
			setPodAnnotation(reserve, AnnotationSecrets, s.refs.podFingerprint(idKey, true))
			setPodAnnotation(sweeper, AnnotationSecrets, s.refs.podFingerprint(idKey, false))
		}
		deployments = append([]*appsv1.Deployment{reserve}, deployments...)
	}
	var children []client.Object
	for _, d := range deployments {
		if s.refs == nil {
			// Without references (a Secret of the spec gone, or changed to
			// values that do not connect) the sale runs on connections opened
			// before, and new pods would not start on the spec's Secrets: a
			// live Deployment only follows the replicas, its pods stay.
			live := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace}}
			switch err := r.readLive(ctx, live); {
			case err == nil:
				live.Spec.Replicas = d.Spec.Replicas
				// Our labels too: one that lost them is outside the cache.
				live.Labels = mergeStrings(live.Labels, d.Labels)
				d = live
			case !apierrors.IsNotFound(err):
				failed("Deployment", d.Name, err)
				continue
			}
		}
		children = append(children, d)
	}
	children = append(children, ReserveService(s.fs),
		DisruptionBudget(s.fs, ComponentReserve), DisruptionBudget(s.fs, ComponentSweeper))
	for _, desired := range children {
		if err := r.apply(ctx, s.fs, desired); err != nil {
			failed(kindOf(desired), desired.GetName(), err)
		}
	}
	return false, nil
}

// readLive reads the live object of obj's name into obj: from the cache, or
// from the API server for one the cache does not hold (it holds only objects
// with our labels: one that lost them, or is not ours, is not there).
func (r *FlashSaleReconciler) readLive(ctx context.Context, obj client.Object) error {
	err := r.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		err = r.apiReader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	}
	return err
}

func setPodAnnotation(d *appsv1.Deployment, key, value string) {
	if d.Spec.Template.Annotations == nil {
		d.Spec.Template.Annotations = map[string]string{}
	}
	d.Spec.Template.Annotations[key] = value
}

func kindOf(o client.Object) string {
	switch o.(type) {
	case *appsv1.Deployment:
		return "Deployment"
	case *corev1.Service:
		return "Service"
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget"
	}
	return fmt.Sprintf("%T", o)
}

// apply creates the child, or updates it when the desired spec is not already
// contained in the live one (fields the API server defaults are left alone, so an
// unchanged child is never rewritten).
func (r *FlashSaleReconciler) apply(ctx context.Context, owner *flashsalev1alpha1.FlashSale, desired client.Object) error {
	if err := ctrl.SetControllerReference(owner, desired, r.Scheme()); err != nil {
		return err
	}
	live := desired.DeepCopyObject().(client.Object)
	err := r.readLive(ctx, live)
	if apierrors.IsNotFound(err) {
		return r.Create(ctx, desired)
	}
	if err != nil {
		return err
	}
	if !metav1.IsControlledBy(live, owner) {
		return fmt.Errorf("it exists and is not owned by FlashSale %s", owner.Name)
	}
	var same bool
	// Labels and annotations others keep on the object (the Deployment
	// controller's revision, a team's labels) stay; ours win.
	desired.SetLabels(mergeStrings(live.GetLabels(), desired.GetLabels()))
	desired.SetAnnotations(mergeStrings(live.GetAnnotations(), desired.GetAnnotations()))
	switch d := desired.(type) {
	case *appsv1.Deployment:
		l := live.(*appsv1.Deployment)
		same = equality.Semantic.DeepDerivative(d.Spec, l.Spec) && equality.Semantic.DeepDerivative(d.Labels, l.Labels) &&
			l.Annotations[AnnotationPodFields] == d.Annotations[AnnotationPodFields]
		// Keep the pod annotations others set (kubectl rollout restart's);
		// ours (the secrets fingerprint) win.
		ann := maps.Clone(l.Spec.Template.Annotations)
		if ann == nil {
			ann = map[string]string{}
		}
		maps.Copy(ann, d.Spec.Template.Annotations)
		d.Spec.Template.Annotations = ann
	case *corev1.Service:
		l := live.(*corev1.Service)
		same = equality.Semantic.DeepDerivative(d.Spec, l.Spec) && equality.Semantic.DeepDerivative(d.Labels, l.Labels)
		d.Spec.ClusterIP, d.Spec.ClusterIPs = l.Spec.ClusterIP, l.Spec.ClusterIPs
	case *policyv1.PodDisruptionBudget:
		l := live.(*policyv1.PodDisruptionBudget)
		same = equality.Semantic.DeepDerivative(d.Spec, l.Spec) && equality.Semantic.DeepDerivative(d.Labels, l.Labels)
	}
	if same {
		return nil
	}
	desired.SetResourceVersion(live.GetResourceVersion())
	return r.Update(ctx, desired)
}

// mergeStrings is live's entries overlaid with ours (nil when both are empty).
func mergeStrings(live, ours map[string]string) map[string]string {
	if len(live) == 0 && len(ours) == 0 {
		return nil
	}
	out := maps.Clone(live)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, ours)
	return out
}

// observe reads the counts into status and sums the sale up in its phase and
// conditions.
func (r *FlashSaleReconciler) observe(ctx context.Context, s *scope) (bool, error) {
	counts, err := s.conn.engine.Counts(ctx)
	if err != nil {
		r.unhealthy(s, classify(err))
		return true, nil
	}
	s.counts = counts
	st := &s.fs.Status
	shards := make([]flashsalev1alpha1.ShardStatus, 0, len(counts.Shards))
	for _, sh := range counts.Shards {
		shards = append(shards, flashsalev1alpha1.ShardStatus{Index: int32(sh.Index), Available: sh.Available, Reserved: sh.Unsold()})
	}
	// Available from Redis, sold from the ledger, reserved the rest (see
	// engine.ShardCounts.Unsold): they never add up to more than the allocation.
	reserved := counts.Unsold()
	changed := st.Allocation != counts.Allocation || st.Available != counts.Available || st.Reserved != reserved ||
		st.Sold != counts.Sold || !equality.Semantic.DeepEqual(st.Shards, shards)
	st.Epoch, st.Allocation = counts.Epoch, counts.Allocation
	st.Available, st.Reserved, st.Sold = counts.Available, reserved, counts.Sold
	st.Shards = shards
	// Renewed with the counts, and at least every CountsStamp: counts older
	// than that were not read (the reads above failed, or nobody ran them).
	if now := r.now(); changed || st.CountsObservedAt == nil || now.Sub(st.CountsObservedAt.Time) >= r.countsStamp() {
		st.CountsObservedAt = &metav1.Time{Time: now}
	}
	// Pending rows in the ledger count too: Completed means nothing can change any more.
	st.Phase = salePhase(s.window.Gate, counts.Available, max(counts.Reserved, counts.Pending))

	admitting := s.window.Gate == stock.StateOpen
	switch {
	case admitting && counts.Available > 0:
		s.condition(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionTrue, ReasonOpen, "reservations are admitted")
	case admitting:
		s.condition(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionTrue, ReasonSoldOut, "admitting, but every unit is reserved or sold")
	default:
		s.condition(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, gateReason(s.window.Gate), gateMessage(s.window.Gate))
	}

	ready, reason, msg, err := r.childrenReady(ctx, s.fs)
	if err != nil {
		return true, err
	}
	if ready {
		s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionTrue, ReasonReady, "stock seeded, Redis and ledger healthy, reservation API and sweeper available")
	} else {
		s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg)
	}

	switch {
	case st.Phase == flashsalev1alpha1.PhaseCompleted:
		s.requeueAfter(idleRefresh)
	case st.Phase == flashsalev1alpha1.PhaseScheduled:
		s.requeueAfter(max(r.statusRefresh(), scheduledRefresh))
	default:
		s.requeueAfter(r.statusRefresh())
	}
	return false, nil
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

// childrenReady: a reserve replica is ready (and one is asked for), and so is
// a sweeper: without one, expired reservations are not given back and the
// sale ends up sold out with units nobody holds.
func (r *FlashSaleReconciler) childrenReady(ctx context.Context, fs *flashsalev1alpha1.FlashSale) (ready bool, reason, msg string, err error) {
	if resolve(fs).replicas == 0 {
		return false, ReasonChildrenNotReady, "spec.reservation.replicas is 0: no reserve pod serves buyers", nil
	}
	for _, c := range []struct{ component, reason, without string }{
		{ComponentReserve, ReasonChildrenNotReady, "buyers reach no reservation API"},
		{ComponentSweeper, ReasonSweeperNotReady, "expired reservations are not given back to the stock"},
	} {
		var d appsv1.Deployment
		name := ChildName(fs, c.component)
		switch err := r.Get(ctx, types.NamespacedName{Namespace: fs.Namespace, Name: name}, &d); {
		case apierrors.IsNotFound(err):
			return false, c.reason, fmt.Sprintf("Deployment %s does not exist yet", name), nil
		case err != nil:
			return false, "", "", err
		case d.Status.ReadyReplicas < 1:
			return false, c.reason, fmt.Sprintf("Deployment %s has 0 of %d replicas ready: %s", name, ptr.Deref(d.Spec.Replicas, 1), c.without), nil
		case rollingOut(&d):
			// Pods of the old template still serve the old settings: a
			// pipeline waiting on Ready after a change waits for the pods too.
			return false, ReasonRollingOut, fmt.Sprintf("Deployment %s is rolling out: %d of %d replicas run the current spec",
				name, d.Status.UpdatedReplicas, d.Status.Replicas), nil
		}
	}
	return true, ReasonReady, "", nil
}

// rollingOut reports pods of an older template still running. A change the
// Deployment controller has not seen yet counts as one, unless it changes
// the replicas: a scale (an autoscaler's, every few seconds during a sale)
// changes the generation too, and is no rollout.
func rollingOut(d *appsv1.Deployment) bool {
	if d.Status.UpdatedReplicas < d.Status.Replicas {
		return true // a rollout under way, whatever changed since
	}
	return d.Status.ObservedGeneration < d.Generation && ptr.Deref(d.Spec.Replicas, 1) == d.Status.Replicas
}

// reportReservePods fills the scale subresource's status (the reserve pods and
// their selector) whatever phase the reconcile stopped at: an autoscaler reads
// it while Redis or the ledger is down too.
func (r *FlashSaleReconciler) reportReservePods(ctx context.Context, fs *flashsalev1alpha1.FlashSale) error {
	fs.Status.ReservationSelector = labels.SelectorFromSet(childLabels(fs, ComponentReserve)).String()
	var d appsv1.Deployment
	switch err := r.Get(ctx, types.NamespacedName{Namespace: fs.Namespace, Name: ChildName(fs, ComponentReserve)}, &d); {
	case apierrors.IsNotFound(err):
		fs.Status.ReservationReplicas = 0
	case err != nil:
		return err
	default:
		fs.Status.ReservationReplicas = d.Status.Replicas
	}
	return nil
}

// eventNoteLimit is the longest event message the API server takes (bytes):
// a longer one is refused and the event lost.
const eventNoteLimit = 1024

// writeStatus patches the status, only when it changed, then emits the
// events.
func (r *FlashSaleReconciler) writeStatus(ctx context.Context, before *flashsalev1alpha1.FlashSale, s *scope) error {
	if s.fs.Status.Phase != before.Status.Phase && s.fs.Status.Phase != "" {
		s.statusEvent(corev1.EventTypeNormal, ReasonPhaseChanged, "Phase %s → %s", orNone(before.Status.Phase), s.fs.Status.Phase)
	}
	s.healthEvents(before.Status.Conditions)
	if !equality.Semantic.DeepEqual(before.Status, s.fs.Status) {
		var err error
		if before.Status.ObservedGeneration == 0 && before.Status.Phase == "" {
			// The first write stores every count, zeros included (a merge patch
			// would leave out fields equal to the empty status), so the printer
			// columns show 0 rather than nothing.
			err = r.Status().Update(ctx, s.fs)
		} else {
			err = r.patchStatus(ctx, before, s.fs)
		}
		if err != nil {
			// What this reconcile did is still said: none of it is done
			// again. What it found against the status it read comes from
			// the next reconcile.
			r.emit(ctx, s, false)
			return err
		}
	}
	r.emit(ctx, s, true)
	return nil
}

// emit sends the reconcile's events, those found against the status it
// read only when withStatus. Logged too: events expire after an hour, and
// the log is the timeline of an incident after that.
func (r *FlashSaleReconciler) emit(ctx context.Context, s *scope, withStatus bool) {
	logger := log.FromContext(ctx)
	for _, e := range s.events {
		if e.fromStatus && !withStatus {
			continue
		}
		r.Recorder.Eventf(s.fs, nil, e.kind, e.reason, e.reason, "%s", truncate(e.message, eventNoteLimit))
		logger.Info(e.message, "event", e.kind, "reason", e.reason)
	}
}

// errStaleStatus: the reconcile read a status older than the stored one.
var errStaleStatus = errors.New("the status was read from a copy older than the stored one")

// patchStatus writes fs's status as a patch from before, guarded by the
// resourceVersion.
//
// A reconcile that read the sale from a cache behind the last status write
// (a child's event queued it meanwhile) would write conditions computed from
// the older status: it gets errStaleStatus (a conflict) and runs again. Only
// the record of a rebuild it did is written, which no later reconcile could
// tell.
//
// A conflict with a change that left the status as it was read (the spec,
// labels, finalizers) is no reason to drop what this reconcile found: the
// patch is sent again on the newer version.
func (r *FlashSaleReconciler) patchStatus(ctx context.Context, before, fs *flashsalev1alpha1.FlashSale) error {
	from := before
	for attempt := 1; ; attempt++ {
		err := r.Status().Patch(ctx, fs, client.MergeFromWithOptions(from, client.MergeFromWithOptimisticLock{}))
		if !apierrors.IsConflict(err) {
			return err
		}
		live := &flashsalev1alpha1.FlashSale{}
		if gerr := r.apiReader.Get(ctx, client.ObjectKeyFromObject(fs), live); gerr != nil || live.UID != fs.UID {
			return err
		}
		stale := !equality.Semantic.DeepEqual(live.Status, before.Status)
		if stale || attempt == 3 {
			if perr := r.keepRebuildRecord(ctx, before, fs, live); perr != nil {
				return perr
			}
			if stale {
				return fmt.Errorf("%w: %w", errStaleStatus, err)
			}
			return err
		}
		from = before.DeepCopy()
		from.ResourceVersion = live.ResourceVersion
	}
}

// keepRebuildRecord writes, over the stored status, the record of a rebuild
// this reconcile did (lastRebuild, and the Redis servers' run ids it rebuilt
// on, without which a restarted operator would take them for restarted and
// rebuild again). Unguarded: these two fields are this reconcile's alone.
func (r *FlashSaleReconciler) keepRebuildRecord(ctx context.Context, before, fs, live *flashsalev1alpha1.FlashSale) error {
	rb := fs.Status.LastRebuild
	if rb == nil || equality.Semantic.DeepEqual(rb, before.Status.LastRebuild) {
		return nil
	}
	rebuilt := live.DeepCopy()
	rebuilt.Status.LastRebuild = rb
	rebuilt.Status.RedisServers = fs.Status.RedisServers
	if equality.Semantic.DeepEqual(rebuilt.Status, live.Status) {
		return nil
	}
	return r.Status().Patch(ctx, rebuilt, client.MergeFrom(live))
}

// healthEvents says when Redis or the ledger stops answering, or refuses the
// operator, and when it is healthy again: the conditions alone leave no
// trace of an outage once it is over. Data loss, an eviction policy and a
// ledger mismatch have events of their own.
func (s *scope) healthEvents(before []metav1.Condition) {
	for _, h := range []struct {
		typ, recovered string
		failures       map[string]string // condition reason → event reason
	}{
		{flashsalev1alpha1.ConditionRedisHealthy, ReasonRedisRecovered, map[string]string{
			ReasonUnreachable: ReasonRedisUnreachable, ReasonForbidden: ReasonRedisForbidden, ReasonUnsupported: ReasonRedisUnsupported}},
		{flashsalev1alpha1.ConditionLedgerHealthy, ReasonLedgerRecovered, map[string]string{
			ReasonUnreachable: ReasonLedgerUnreachable, ReasonForbidden: ReasonLedgerForbidden, ReasonInvalid: ReasonLedgerSecretInvalid}},
	} {
		was := meta.FindStatusCondition(before, h.typ)
		now := meta.FindStatusCondition(s.fs.Status.Conditions, h.typ)
		switch {
		case now == nil || (was != nil && was.Status == now.Status && was.Reason == now.Reason):
		case now.Status == metav1.ConditionFalse && h.failures[now.Reason] != "":
			s.statusEvent(corev1.EventTypeWarning, h.failures[now.Reason], "%s", now.Message)
		case now.Status == metav1.ConditionTrue && was != nil && was.Status == metav1.ConditionFalse:
			s.statusEvent(corev1.EventTypeNormal, h.recovered, "%s again: %s", h.typ, now.Message)
		}
	}
}

// finalize closes the gates, deletes the Redis keys and the children, marks the
// ledger campaign deleted (orders stay: they are the book of record), then lets
// the FlashSale go.
func (r *FlashSaleReconciler) finalize(ctx context.Context, fs *flashsalev1alpha1.FlashSale) error {
	if !controllerutil.ContainsFinalizer(fs, Finalizer) {
		return nil
	}
	name := types.NamespacedName{Namespace: fs.Namespace, Name: fs.Name}
	// The cache can still hold a sale whose finalizer was just removed: the
	// children deleted below queue another reconcile. Ask the API server, or
	// a cleanup already done runs again, and once its connections are
	// dropped it warns that it was skipped.
	live := &flashsalev1alpha1.FlashSale{}
	if err := r.apiReader.Get(ctx, name, live); apierrors.IsNotFound(err) {
		r.conns.drop(name)
		return nil
	} else if err != nil {
		return err
	}
	if live.UID != fs.UID || !controllerutil.ContainsFinalizer(live, Finalizer) {
		return nil
	}
	live.DeepCopyInto(fs) // the finalizer's patch is guarded by its resourceVersion
	refs, err := readReferences(ctx, r.secrets, fs)
	var refErr *referenceError
	cached := r.conns.cached(name)
	if cached != nil && cached.engine.Config().CampaignID != string(fs.UID) {
		cached = nil // a sale of the same name, deleted since
	}
	switch {
	case errors.As(err, &refErr) && cached != nil:
		// The Secrets went with the sale (a namespace deleted, a GitOps
		// prune): the connections opened before still clean up.
		if err := cached.engine.Delete(ctx); err != nil {
			return fmt.Errorf("cleaning up the sale's Redis keys and ledger campaign: %w", err)
		}
	case errors.As(err, &refErr):
		msg := "Redis keys and ledger campaign left in place: " + refErr.message
		r.Recorder.Eventf(fs, nil, corev1.EventTypeWarning, ReasonCleanupSkipped, "Cleanup", "%s", truncate(msg, eventNoteLimit))
		log.FromContext(ctx).Info(msg, "event", corev1.EventTypeWarning, "reason", ReasonCleanupSkipped)
	case err != nil:
		return err
	default:
		set := resolve(fs)
		// Bounded: a ledger that hangs must not keep the sale selling until
		// the reconcile's deadline; it is ended through Redis below.
		gctx, cancel := context.WithTimeout(ctx, r.phaseTimeout())
		defer cancel()
		conn, err := r.conns.get(gctx, name, refs, engine.Config{
			CampaignID: string(fs.UID), Namespace: fs.Namespace, Name: fs.Name, SKU: fs.Spec.SKU,
			Allocation: fs.Spec.Allocation, Shards: int(set.shards), MaxPerUser: int(set.maxPerUser),
			TTL: set.ttl, Grace: set.grace, StealProbes: int(set.stealProbes), IDSecret: config.DeriveIDSecret(refs.admissionKey),
		})
		var le *ledgerError
		if errors.As(err, &le) {
			// The deletion waits for the ledger; the sale is ended meanwhile,
			// through Redis alone.
			cctx, cancel := closingContext(ctx)
			store, done := redisOnly(fs, &refs)
			_, _ = store.SetGate(cctx, stock.StateEnded, 0)
			done()
			cancel()
		}
		if err != nil {
			return err
		}
		if err := conn.engine.Delete(ctx); err != nil {
			return fmt.Errorf("cleaning up the sale's Redis keys and ledger campaign: %w", err)
		}
	}
	// Owner references remove the children on a real cluster; deleting them here
	// also covers API servers without a garbage collector and stops the pods first.
	// An object of the same name that is not the sale's is left alone. Read
	// from the API server: the cache misses a child that lost its labels.
	for _, obj := range []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: fs.Namespace, Name: ChildName(fs, ComponentReserve)}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: fs.Namespace, Name: ChildName(fs, ComponentSweeper)}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: fs.Namespace, Name: ChildName(fs, ComponentReserve)}},
		&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: fs.Namespace, Name: ChildName(fs, ComponentReserve)}},
		&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: fs.Namespace, Name: ChildName(fs, ComponentSweeper)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: fs.Namespace, Name: ChildName(fs, ComponentIDs)}},
	} {
		err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if err == nil && metav1.IsControlledBy(obj, fs) {
			err = r.Delete(ctx, obj, client.Preconditions{UID: ptr.To(obj.GetUID())})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	// The connections go once the finalizer is off: a retry after a failed
	// patch (a conflict) still finds them, and does not skip a cleanup that
	// is already done.
	if err := r.setFinalizer(ctx, fs, false); err != nil {
		return err
	}
	r.conns.drop(name)
	r.secrets.forget(
		types.NamespacedName{Namespace: fs.Namespace, Name: fs.Spec.Redis.SecretRef.Name},
		types.NamespacedName{Namespace: fs.Namespace, Name: fs.Spec.Postgres.SecretRef.Name},
		types.NamespacedName{Namespace: fs.Namespace, Name: fs.Spec.Admission.SecretRef.Name},
		types.NamespacedName{Namespace: fs.Namespace, Name: ChildName(fs, ComponentIDs)})
	return nil
}

// setFinalizer adds or removes the finalizer with a patch of the finalizers
// alone (guarded by the resourceVersion). An Update would send back the whole
// object as Go re-encodes it ("10m" becomes "10m0s", an offset becomes UTC):
// the stored spec would drift from the manifest, and a later server-side
// apply would conflict with the controller over fields it never set.
func (r *FlashSaleReconciler) setFinalizer(ctx context.Context, fs *flashsalev1alpha1.FlashSale, present bool) error {
	before := fs.DeepCopy()
	changed := controllerutil.AddFinalizer(fs, Finalizer)
	if !present {
		changed = controllerutil.RemoveFinalizer(fs, Finalizer)
	}
	if !changed {
		return nil
	}
	return r.Patch(ctx, fs, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

// SetupWithManager registers the controller: FlashSales, their children, and the
// Secrets they reference (a Secret created after its FlashSale unblocks it).
// The manager should be made with CacheOptions and ClientOptions.
func (r *FlashSaleReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.apiReader = mgr.GetAPIReader()
	r.secrets = newSecretReader(mgr.GetCache(), mgr.GetAPIReader())
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

func orNone(p flashsalev1alpha1.FlashSalePhase) string {
	if p == "" {
		return "(none)"
	}
	return string(p)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = "…"
	cut := n - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}

// ledgerUnreachable: LedgerHealthy says the ledger did not answer (not that
// it refused the operator or holds another sale's data, which a ping does
// not tell).
func ledgerUnreachable(fs *flashsalev1alpha1.FlashSale) bool {
	c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == ReasonUnreachable
}

// pingLedger asks the ledger for a sign of life, briefly: a ledger that hangs
// must not hold up the phases that do not need it.
func pingLedger(ctx context.Context, c *campaignConn) error {
	ctx, cancel := context.WithTimeout(ctx, replaceTimeout)
	defer cancel()
	return c.ledger.Ping(ctx)
}
