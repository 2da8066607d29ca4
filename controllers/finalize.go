package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

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
	// A rebuild running must not write what the cleanup deletes.
	if c := r.conns.cached(name); c != nil {
		if run := c.rebuild.Load(); run != nil {
			run.stop()
		}
	}
	// A namespace's deletion removes the sale's Secrets, a Redis or
	// PostgreSQL that ran in it and (watchNamespaces) the manager's Role
	// before the sale. There, what the manager may no longer read or delete
	// is left to that deletion, and a cleanup that keeps failing is given up
	// after namespaceDeletionWait.
	deleting := sync.OnceValue(func() bool { return r.namespaceDeleting(ctx, fs.Namespace) })
	// The stores' part keeps back what the rest of the reconcile needs: a
	// store that hangs in a namespace being deleted is given up below.
	sctx, cancel := phaseContext(ctx)
	err := r.cleanupStores(sctx, fs, deleting)
	cancel()
	if err != nil {
		if ctx.Err() != nil || !deleting() || r.now().Sub(fs.DeletionTimestamp.Time) < namespaceDeletionWait {
			return err
		}
		r.cleanupSkipped(ctx, fs, fmt.Sprintf("Redis keys and ledger campaign left in place: namespace %q is being deleted "+
			"and the sale's cleanup has failed for %s since its deletion: %v", fs.Namespace, namespaceDeletionWait, err))
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
		if apierrors.IsForbidden(err) && deleting() {
			continue // the namespace's deletion removes it
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

// reportDeleting says on Ready that the sale is being deleted and why its
// cleanup waits: the rest of the status is the last reconcile's, and
// without this Ready would say True for the whole wait.
func (r *FlashSaleReconciler) reportDeleting(ctx context.Context, fs *flashsalev1alpha1.FlashSale, err error) {
	before := fs.DeepCopy()
	meta.SetStatusCondition(&fs.Status.Conditions, metav1.Condition{
		Type: flashsalev1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonDeleting, ObservedGeneration: fs.Generation,
		Message: truncate("the sale is being deleted; its cleanup failed and is retried: "+err.Error(), eventNoteLimit),
	})
	// The phase and Admitting said what the live sale did: once every shard
	// is ended, they say so, or a sale whose deletion waits reads Open.
	var ended *endedWaiting
	if errors.As(err, &ended) {
		fs.Status.Phase = flashsalev1alpha1.PhaseEnded
		meta.SetStatusCondition(&fs.Status.Conditions, metav1.Condition{
			Type: flashsalev1alpha1.ConditionAdmitting, Status: metav1.ConditionFalse, Reason: ReasonEnded, ObservedGeneration: fs.Generation,
			Message: "the sale is being deleted: its shards were ended (or are closed) and refuse reservations while the cleanup waits",
		})
	}
	if equality.Semantic.DeepEqual(before.Status, fs.Status) {
		return
	}
	// Its own time: the failure may be the reconcile's deadline.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statusWriteTime)
	defer cancel()
	if perr := r.Status().Patch(wctx, fs, client.MergeFrom(before)); perr != nil && !apierrors.IsNotFound(perr) {
		log.FromContext(ctx).Info("cannot report the deletion's wait", "err", perr.Error())
	}
}

// cleanupStores ends the sale and deletes its Redis keys and ledger
// campaign, with the connections opened before when its Secrets are gone;
// without them either, it skips the cleanup, saying so.
func (r *FlashSaleReconciler) cleanupStores(ctx context.Context, fs *flashsalev1alpha1.FlashSale, deleting func() bool) error {
	name := types.NamespacedName{Namespace: fs.Namespace, Name: fs.Name}
	refs, err := readReferences(ctx, r.secrets, fs)
	var refErr *referenceError
	if errors.As(err, &refErr) {
		// The admission key only lets the pods reserve: without it, the
		// Redis and ledger Secrets still end the sale and clean it up.
		if store, serr := readStoreReferences(ctx, r.secrets, fs); serr == nil {
			refs, err = store, nil
		}
	}
	if apierrors.IsForbidden(err) && deleting() {
		// The namespace's deletion took the manager's Role in it
		// (watchNamespaces): its Secrets are going too.
		refErr = &referenceError{ReasonSecretNotFound, fmt.Sprintf("namespace %q is being deleted and the sale's Secrets can no longer be read: %v", fs.Namespace, err)}
		err = refErr
	}
	cached := r.conns.cached(name)
	if cached != nil && cached.engine.Config().CampaignID != string(fs.UID) {
		cached = nil // a sale of the same name, deleted since
	}
	switch {
	case errors.As(err, &refErr) && cached != nil:
		// The Secrets went with the sale (a namespace deleted, a GitOps
		// prune): the connections opened before still clean up.
		if err := cached.engine.Delete(ctx); err != nil {
			return deleteFailed(err)
		}
	case errors.As(err, &refErr):
		r.cleanupSkipped(ctx, fs, "Redis keys and ledger campaign left in place: "+refErr.message)
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
			TTL: set.ttl, Grace: set.grace, StealProbes: int(set.stealProbes), IDSecret: idSecret(refs),
		})
		if err != nil && cached != nil {
			// Secrets changed to values that do not connect: the pods still
			// sell with the values they started with, and the connections
			// opened before (the ones connect kept) end the sale and clean
			// it up.
			conn, err = cached, nil
		}
		var le *ledgerError
		if errors.As(err, &le) {
			// The deletion waits for the ledger; the sale is ended meanwhile,
			// through Redis alone.
			cctx, cancel := closingContext(ctx)
			gates, done := redisOnly(fs, &refs)
			endErr := gates.End(cctx)
			done()
			cancel()
			if endErr == nil {
				return &endedWaiting{err}
			}
		}
		if err != nil {
			return err
		}
		if err := conn.engine.Delete(ctx); err != nil {
			return deleteFailed(err)
		}
	}
	return nil
}

// endedWaiting is a cleanup that ended the sale through Redis and waits for
// the ledger to go on. A shard the end left as it was (being rebuilt,
// failed closed, without meta) refuses reservations too.
type endedWaiting struct{ err error }

func (e *endedWaiting) Error() string { return e.err.Error() }
func (e *endedWaiting) Unwrap() error { return e.err }

// deleteFailed is the error of engine.Delete's err: one from the ledger
// comes after every shard was ended (Delete ends them first).
func deleteFailed(err error) error {
	err = fmt.Errorf("cleaning up the sale's Redis keys and ledger campaign: %w", err)
	if errors.Is(err, engine.ErrLedger) || errors.Is(err, engine.ErrLedgerMismatch) {
		return &endedWaiting{err}
	}
	return err
}

// namespaceDeletionWait is how long after a sale's deletion began a
// cleanup that keeps failing holds it in a namespace being deleted: its
// stores may have lived there and gone first. A minute, as an owner whose
// Lease goes unrenewed is taken for gone (DefaultOwnerStale).
const namespaceDeletionWait = time.Minute

// namespaceDeleting tells whether the namespace is being deleted. One the
// manager may not read is taken for one that is not.
func (r *FlashSaleReconciler) namespaceDeleting(ctx context.Context, namespace string) bool {
	ns := &corev1.Namespace{}
	if err := r.apiReader.Get(ctx, types.NamespacedName{Name: namespace}, ns); err != nil {
		return false
	}
	return !ns.DeletionTimestamp.IsZero()
}

// cleanupSkipped says that the sale goes without its cleanup, and why. The
// API server refuses events in a namespace being deleted: the log keeps it.
func (r *FlashSaleReconciler) cleanupSkipped(ctx context.Context, fs *flashsalev1alpha1.FlashSale, msg string) {
	r.recordEvent(ctx, fs, nil, corev1.EventTypeWarning, ReasonCleanupSkipped, "Cleanup", msg)
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
