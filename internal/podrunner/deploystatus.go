package podrunner

import (
	"context"
	"fmt"
	"sort"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

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
