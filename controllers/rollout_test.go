package controllers_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
)

// A pipeline that applies a change and waits for Ready (kubectl wait, a GitOps
// health check) must not see Ready True for the new generation while the pods
// still run the old template: not in the status written right after the
// Deployment, from a cache that has not seen the write yet, and not when the
// change scales the Deployment too (only a scale alone is no rollout). The
// Deployment controller is the test (envtest runs none): it has not seen a
// change until markReady.
func TestAChangeIsNotReadyBeforeItsRollout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("swap", 100)
	markReady(t, e.ns, "swap-reserve")
	markReady(t, e.ns, "swap-sweeper")
	e.waitFor("swap", settle, "Ready", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue)
	})
	// The status written right after a write of the Deployments is computed
	// from a cache that has not seen it yet.
	e.lag.set(true)
	for _, c := range []struct {
		name    string
		rollout bool
		change  func(*flashsalev1alpha1.FlashSale)
	}{
		{"template", true, func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.MaxPerUser = ptr.To[int32](2) }},
		{"template and replicas", true, func(fs *flashsalev1alpha1.FlashSale) {
			// Only the reserve pods' template: the sweeper's stays as it is.
			fs.Spec.Reservation.Resources = &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}
			fs.Spec.Reservation.Replicas = ptr.To[int32](3)
		}},
		{"replicas alone", false, func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Reservation.Replicas = ptr.To[int32](4) }},
	} {
		seen := watchReady(t, e.ns, "swap")
		updateSpec(t, e.ns, "swap", c.change)
		gen := e.get("swap").Generation
		first := seen.firstFor(t, gen)
		t.Logf("%s: %+v", c.name, first)
		switch {
		case c.rollout && (first.Status != metav1.ConditionFalse || first.Reason != controllers.ReasonRollingOut):
			t.Fatalf("%s: the first Ready for generation %d is %s/%s %q, want False/RollingOut", c.name, gen, first.Status, first.Reason, first.Message)
		case !c.rollout && first.Status != metav1.ConditionTrue:
			t.Fatalf("%s: the first Ready for generation %d is %s/%s %q, want True", c.name, gen, first.Status, first.Reason, first.Message)
		}
		seen.stop()
		markReady(t, e.ns, "swap-reserve")
		markReady(t, e.ns, "swap-sweeper")
		e.waitFor("swap", settle, c.name+": Ready after the rollout", func(fs *flashsalev1alpha1.FlashSale) bool {
			r := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
			return r != nil && r.Status == metav1.ConditionTrue && r.ObservedGeneration == gen
		})
	}
}

// readyWatch is a watch of one sale's Ready conditions.
type readyWatch struct {
	w    watch.Interface
	name string
}

func watchReady(t *testing.T, ns, name string) *readyWatch {
	t.Helper()
	w, err := k8s.Watch(context.Background(), &flashsalev1alpha1.FlashSaleList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	return &readyWatch{w: w, name: name}
}

func (r *readyWatch) stop() { r.w.Stop() }

// firstFor is the first Ready the sale was stored with for generation gen or
// a later one.
func (r *readyWatch) firstFor(t *testing.T, gen int64) metav1.Condition {
	t.Helper()
	timeout := time.After(settle)
	for {
		select {
		case ev, ok := <-r.w.ResultChan():
			if !ok {
				t.Fatal("the watch ended")
			}
			fs, isSale := ev.Object.(*flashsalev1alpha1.FlashSale)
			if !isSale || fs.Name != r.name {
				continue
			}
			if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c != nil && c.ObservedGeneration >= gen {
				return *c
			}
		case <-timeout:
			t.Fatalf("no Ready for generation %d in %s", gen, settle)
		}
	}
}
