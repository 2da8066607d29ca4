package controllers

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// observe reads the counts and the readiness of the children, for the
// status and its phase.
func (r *FlashSaleReconciler) observe(ctx context.Context, s *scope) (bool, error) {
	counts, err := s.conn.engine.Counts(ctx)
	if err != nil {
		r.unhealthy(s, classify(err))
		return true, nil
	}
	s.counts, s.countsAt, s.gate = &counts, r.now(), s.window.Gate
	if s.gate == engine.StateOpen {
		// The shards refuse outside the schedule by the Redis clock, open
		// gate or not (reserve.lua): a manager whose clock runs ahead of it
		// opened them early, one behind has not ended them yet.
		if now, err := s.conn.engine.Gates().Now(ctx); err == nil {
			w := saleWindow(&s.fs.Spec, now)
			if w.Gate == engine.StateNotStarted || w.Gate == engine.StateEnded {
				s.gate = w.Gate
			}
			if w.Gate == engine.StateNotStarted {
				// Nothing else wakes the reconcile at the start by the
				// Redis clock: the manager's own has passed it.
				s.requeueAfter(w.Next)
			}
		}
	}
	r.readClocks(ctx, s)
	r.readReplication(ctx, s)
	ready, reason, msg, err := r.childrenReady(ctx, s.fs, s.written)
	if err != nil {
		return true, err
	}
	s.children = &readiness{ready: ready, reason: reason, message: msg}
	// The refresh follows the phase the counts give.
	switch salePhase(s.gate, counts.Available, max(counts.Reserved, counts.Pending)) {
	case flashsalev1alpha1.PhaseCompleted:
		s.requeueAfter(idleRefresh)
	case flashsalev1alpha1.PhaseScheduled:
		s.requeueAfter(max(r.statusRefresh(), scheduledRefresh))
	default:
		s.requeueAfter(r.statusRefresh())
	}
	return false, nil
}

// childrenReady: a reserve replica is ready (and one is asked for), and so is
// a sweeper: without one, expired reservations are not given back and the
// sale ends up sold out with units nobody holds. written are the Deployments
// this reconcile wrote, as the API server stored them: the cache may not have
// seen the write yet, and would report the old template's pods as current.
func (r *FlashSaleReconciler) childrenReady(ctx context.Context, fs *flashsalev1alpha1.FlashSale, written []*appsv1.Deployment) (ready bool, reason, msg string, err error) {
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
		}
		for _, w := range written {
			if w.Name == name && w.Generation > d.Generation {
				d = *w
			}
		}
		refused, why := deploymentTrouble(&d)
		switch {
		case d.Status.ReadyReplicas < 1:
			// The component's reason, refused or not: SweeperNotReady
			// has an alert of its own.
			return false, c.reason, fmt.Sprintf("Deployment %s has 0 of %d replicas ready: %s%s",
				name, ptr.Deref(d.Spec.Replicas, 1), c.without, why), nil
		case refused:
			// Some serve, but the replicas asked for will not exist until
			// the quota or the policy changes (a scale-up, a rollout).
			return false, ReasonReplicaFailure, fmt.Sprintf("Deployment %s has %d of %d replicas ready%s",
				name, d.Status.ReadyReplicas, ptr.Deref(d.Spec.Replicas, 1), why), nil
		case rollingOut(&d):
			// Pods of the old template still serve the old settings: a
			// pipeline waiting on Ready after a change waits for the pods too.
			progress := fmt.Sprintf("%d of %d replicas run the current spec", d.Status.UpdatedReplicas, d.Status.Replicas)
			if d.Status.ObservedGeneration < d.Generation {
				progress = fmt.Sprintf("the Deployment controller has not seen generation %d yet", d.Generation)
			}
			return false, ReasonRollingOut, fmt.Sprintf("Deployment %s is rolling out: %s%s", name, progress, why), nil
		}
	}
	return true, ReasonReady, "", nil
}

// progressDeadlineExceeded is the Progressing condition's reason when a
// rollout made no progress for spec.progressDeadlineSeconds.
const progressDeadlineExceeded = "ProgressDeadlineExceeded"

// deploymentTrouble is what the Deployment's conditions say, for Ready's
// message, that the replica counts alone would not: pods the cluster refuses
// (a ResourceQuota, a LimitRange, Pod Security admission), which are then
// never created, or else a rollout past its progress deadline.
func deploymentTrouble(d *appsv1.Deployment) (refused bool, why string) {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue {
			return true, ": " + c.Reason + ": " + c.Message
		}
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse && c.Reason == progressDeadlineExceeded {
			return false, " (" + c.Reason + ": " + c.Message + ")"
		}
	}
	return false, ""
}

// rollingOut reports pods of an older template still running. A change the
// Deployment controller has not seen yet counts as one when the operator
// changed the template in it (AnnotationTemplateGeneration; a write that
// stored no change left the generation below the annotation), or when it
// leaves the replicas as they are (someone else's template change, kubectl
// rollout restart). A scale alone (an autoscaler's, every few seconds during
// a sale) changes the generation too, and is no rollout.
func rollingOut(d *appsv1.Deployment) bool {
	if d.Status.UpdatedReplicas < d.Status.Replicas {
		return true // a rollout under way, whatever changed since
	}
	seen := d.Status.ObservedGeneration
	if seen >= d.Generation {
		return false
	}
	if g, _, ok := readTemplateStamp(d); ok && seen < min(g, d.Generation) {
		return true
	}
	return ptr.Deref(d.Spec.Replicas, 1) == d.Status.Replicas
}

// reservePods reads the reserve Deployment's replicas for the scale
// subresource's status (0 when it does not exist).
func (r *FlashSaleReconciler) reservePods(ctx context.Context, fs *flashsalev1alpha1.FlashSale) (int32, error) {
	var d appsv1.Deployment
	switch err := r.Get(ctx, types.NamespacedName{Namespace: fs.Namespace, Name: ChildName(fs, ComponentReserve)}, &d); {
	case apierrors.IsNotFound(err):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return d.Status.Replicas, nil
}
