package controllers

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

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
