package controllers_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
)

// salePod creates a pod of the sale's component as its ReplicaSet would
// (the Deployment's labels), then writes its status through the status
// subresource as the kubelet would: envtest runs no kubelet.
func (e *env) salePod(sale, component, name string) *corev1.Pod {
	e.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Labels: map[string]string{
			controllers.LabelName: "flashsale", controllers.LabelInstance: sale, controllers.LabelComponent: component,
			controllers.LabelManagedBy: controllers.ManagedBy, controllers.LabelFlashSale: sale,
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: component, Image: "flashsale-operator:test"}}},
	}
	e.create(p)
	return p
}

// setContainer writes the pod's one container status, through the status
// subresource.
func (e *env) setContainer(p *corev1.Pod, cs corev1.ContainerStatus) {
	e.t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		p.Status.Phase = corev1.PodRunning
		cs.Name, cs.Image = p.Spec.Containers[0].Name, p.Spec.Containers[0].Image
		p.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
		return k8s.Status().Update(ctx, p)
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

func runningSince(t time.Time, restarts int32, last *corev1.ContainerStateTerminated) corev1.ContainerStatus {
	return corev1.ContainerStatus{Ready: true, Started: ptr.To(true), RestartCount: restarts,
		State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t)}},
		LastTerminationState: corev1.ContainerState{Terminated: last}}
}

// One of two reserve replicas is OOM-killed, restarted, killed again and
// left in CrashLoopBackOff while the other serves: Degraded says so, naming
// the pod, with one Warning event, and Ready stays True throughout. The
// operator restarted meanwhile says the same, from the pods, without a
// second event. It clears when the replica has run 10 minutes since (the
// controller's clock moved on; the pods did not change), with a Normal event.
func TestCrashingReplicaIsReportedWhileTheSaleStaysReady(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	var ahead atomic.Int64
	e.clock = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	stop := e.startController()
	s := e.sale("crashy", 10)
	s.fs.Spec.Reservation.Replicas = ptr.To[int32](2)
	e.apply(s)
	e.waitFor("crashy", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	markReady(t, e.ns, "crashy-reserve")
	markReady(t, e.ns, "crashy-sweeper")

	start := time.Now().Add(-time.Hour).Truncate(time.Second)
	good := e.salePod("crashy", controllers.ComponentReserve, "crashy-reserve-5d8f7-good1")
	bad := e.salePod("crashy", controllers.ComponentReserve, "crashy-reserve-5d8f7-bad01")
	sweeper := e.salePod("crashy", controllers.ComponentSweeper, "crashy-sweeper-6b9c4-swp01")
	for _, p := range []*corev1.Pod{good, bad, sweeper} {
		e.setContainer(p, runningSince(start, 0, nil))
	}
	fs := e.waitFor("crashy", settle, "Degraded False, Ready True", func(fs *flashsalev1alpha1.FlashSale) bool {
		return reasonIs(flashsalev1alpha1.ConditionDegraded, controllers.ReasonReplicasStable)(fs) &&
			conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue)
	})
	readySince := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady).LastTransitionTime

	// The kernel kills it at its limit; the kubelet restarts it at once.
	killed := time.Now().Add(-2 * time.Second).Truncate(time.Second)
	oom := &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137, StartedAt: metav1.NewTime(start), FinishedAt: metav1.NewTime(killed)}
	e.setContainer(bad, runningSince(killed.Add(time.Second), 1, oom))
	fs = e.waitFor("crashy", settle, "Degraded True, OOMKilled", reasonIs(flashsalev1alpha1.ConditionDegraded, controllers.ReasonOOMKilled))
	c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionDegraded)
	if c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "Deployment crashy-reserve pod crashy-reserve-5d8f7-bad01: OOMKilled (exit code 137)") ||
		!strings.HasSuffix(c.Message, ", 1 restart") || strings.Contains(c.Message, "good1") {
		t.Fatalf("Degraded: %+v", c)
	}
	if !hasEventSaying(t, e.ns, "crashy", controllers.ReasonReplicaCrashing, "crashy-reserve-5d8f7-bad01: OOMKilled") {
		t.Fatal("no ReplicaCrashing event naming the pod")
	}

	// Killed again, now in back-off.
	again := &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137, StartedAt: metav1.NewTime(killed.Add(time.Second)), FinishedAt: metav1.Now()}
	e.setContainer(bad, corev1.ContainerStatus{RestartCount: 2,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s restarting failed container"}},
		LastTerminationState: corev1.ContainerState{Terminated: again}})
	e.waitFor("crashy", settle, "Degraded naming the back-off", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionDegraded)
		return c != nil && c.Reason == controllers.ReasonOOMKilled && strings.Contains(c.Message, "2 restarts, waiting in CrashLoopBackOff")
	})
	// The columns say it too.
	if cols := kubectl(t, "get", "fs", "crashy", "-n", e.ns, "--no-headers"); !strings.Contains(strings.Join(strings.Fields(cols), " "), "True True") {
		t.Fatalf("kubectl get fs: %q, want Ready True and Degraded True", cols)
	}

	// An operator restarted mid-episode reads the same from the pods, and
	// says nothing new.
	stop()
	e.startController()
	time.Sleep(3 * time.Second) // several refreshes
	fs = e.get("crashy")
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionDegraded); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Degraded after the restart: %+v", c)
	}
	if n := countEvents(t, e.ns, "crashy", controllers.ReasonReplicaCrashing); n != 1 {
		t.Fatalf("%d ReplicaCrashing events for one episode, want 1", n)
	}

	// Running since, without another kill: Degraded holds for 10 minutes
	// after the restart, then clears.
	restarted := time.Now().Truncate(time.Second)
	e.setContainer(bad, runningSince(restarted, 2, again))
	ahead.Store(int64(9 * time.Minute))
	time.Sleep(3 * time.Second)
	if fs = e.get("crashy"); !conditionIs(fs, flashsalev1alpha1.ConditionDegraded, metav1.ConditionTrue) {
		t.Fatalf("Degraded cleared 9 minutes after the restart: %+v", meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionDegraded))
	}
	ahead.Store(int64(10*time.Minute + 2*time.Second))
	fs = e.waitFor("crashy", settle, "Degraded False", reasonIs(flashsalev1alpha1.ConditionDegraded, controllers.ReasonReplicasStable))
	if !hasEvent(t, e.ns, "crashy", controllers.ReasonReplicasRecovered) {
		t.Fatal("no ReplicasRecovered event")
	}
	// Ready never moved.
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c.Status != metav1.ConditionTrue || !c.LastTransitionTime.Equal(&readySince) {
		t.Fatalf("Ready moved while one replica crashed: %+v (True since %v)", c, readySince)
	}
	var p corev1.Pod
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: bad.Name}, &p); err != nil || p.Status.ContainerStatuses[0].RestartCount != 2 {
		t.Fatalf("the pod changed: %v %+v", err, p.Status)
	}
}
