package controllers_test

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
)

// The ReplicaSet controller cannot create a Deployment's pods (a
// ResourceQuota, a LimitRange or Pod Security admission refuses them): the
// Deployment says so in its ReplicaFailure condition, and Ready quotes it
// instead of only counting the missing replicas, with the component's
// reason while none is ready (the sweeper's has an alert of its own), and
// ReplicaFailure while some serve. Once the condition goes, so does the
// message. A rollout past its progress deadline is named too.
func TestPodsTheClusterRefusesAreNamedInReady(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("quota", 10)
	markReady(t, e.ns, "quota-reserve")
	refuse(t, e.ns, "quota-sweeper", 0)
	c := readyOf(e.waitFor("quota", settle, "Ready to quote the sweeper's refusal", readySays("exceeded quota")))
	if c.Reason != controllers.ReasonSweeperNotReady || !strings.Contains(c.Message, "quota-sweeper has 0 of 2 replicas ready") {
		t.Fatalf("Ready %s: %s", c.Reason, c.Message)
	}
	markReady(t, e.ns, "quota-sweeper")
	setDeploymentStatus(t, e.ns, "quota-sweeper", func(d *appsv1.Deployment) { d.Status.Conditions = nil })

	refuse(t, e.ns, "quota-reserve", 0)
	c = readyOf(e.waitFor("quota", settle, "Ready to quote the reserve's refusal", readySays("quota-reserve has 0 of 2 replicas ready")))
	if c.Reason != controllers.ReasonChildrenNotReady || !strings.Contains(c.Message, "FailedCreate: "+quotaExceeded) {
		t.Fatalf("Ready %s: %s", c.Reason, c.Message)
	}
	// One replica serves; the other is refused.
	refuse(t, e.ns, "quota-reserve", 1)
	c = readyOf(e.waitFor("quota", settle, "Ready to say one reserve replica serves", readySays("has 1 of 2 replicas ready")))
	if c.Reason != controllers.ReasonReplicaFailure || !strings.Contains(c.Message, "FailedCreate: "+quotaExceeded) {
		t.Fatalf("Ready %s: %s", c.Reason, c.Message)
	}

	// A create went through: the ReplicaSet controller removes the condition.
	markReady(t, e.ns, "quota-reserve")
	setDeploymentStatus(t, e.ns, "quota-reserve", func(d *appsv1.Deployment) { d.Status.Conditions = nil })
	e.waitFor("quota", settle, "Ready again", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue)
	})

	// A rollout whose new pods never get ready.
	setDeploymentStatus(t, e.ns, "quota-reserve", func(d *appsv1.Deployment) {
		now := metav1.Now()
		d.Status.UpdatedReplicas = 0
		d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse,
			Reason: "ProgressDeadlineExceeded", Message: `ReplicaSet "quota-reserve-5c6b" has timed out progressing.`,
			LastUpdateTime: now, LastTransitionTime: now}}
	})
	c = readyOf(e.waitFor("quota", settle, "Ready to name the progress deadline", readySays("has timed out progressing")))
	if c.Reason != controllers.ReasonRollingOut || !strings.Contains(c.Message, "ProgressDeadlineExceeded") {
		t.Fatalf("Ready %s: %s", c.Reason, c.Message)
	}
}

const quotaExceeded = `pods "quota-x2" is forbidden: exceeded quota: compute, requested: limits.memory=512Mi, used: limits.memory=4Gi, limited: limits.memory=4Gi`

// refuse writes the status of a Deployment whose ReplicaSet controller
// created ready pods and had the others refused by a ResourceQuota.
func refuse(t *testing.T, ns, name string, ready int32) {
	t.Helper()
	setDeploymentStatus(t, ns, name, func(d *appsv1.Deployment) {
		now := metav1.Now()
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation,
			Replicas: ready, ReadyReplicas: ready, AvailableReplicas: ready, UpdatedReplicas: ready,
			Conditions: []appsv1.DeploymentCondition{
				{Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: quotaExceeded,
					LastUpdateTime: now, LastTransitionTime: now},
			}}
	})
}

// readySays holds when the sale's Ready condition is False and its message
// contains text.
func readySays(text string) func(*flashsalev1alpha1.FlashSale) bool {
	return func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, text)
	}
}

func readyOf(fs *flashsalev1alpha1.FlashSale) *metav1.Condition {
	return meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
}

// setDeploymentStatus plays the Deployment controller's part: it writes
// change to the Deployment's status.
func setDeploymentStatus(t *testing.T, ns, name string, change func(*appsv1.Deployment)) {
	t.Helper()
	ctx := context.Background()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var d appsv1.Deployment
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &d); err != nil {
			return err
		}
		change(&d)
		return k8s.Status().Update(ctx, &d)
	}); err != nil {
		t.Fatal(err)
	}
}
