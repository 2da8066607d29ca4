package controllers_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// renewLease keeps a Lease of the test's namespace renewed, as a running
// install's leader election does, until the returned func is called.
func (e *env) renewLease(name string) (stop func()) {
	e.t.Helper()
	ctx := context.Background()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](15),
			RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	if err := k8s.Create(ctx, lease); err != nil {
		e.t.Fatal(err)
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			if err := k8s.Update(ctx, lease); err != nil {
				_ = k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: name}, lease)
			}
		}
	}()
	var once bool
	stop = func() {
		if !once {
			once = true
			close(done)
			<-stopped
		}
	}
	e.t.Cleanup(stop)
	return stop
}

// Two operator installs that both watch a sale's namespace (an old one left
// behind, a second release of the chart): the first claims the sale, and
// the second leaves it alone while the first's Lease is renewed, saying so
// in an event, instead of writing its own image into the sale's
// Deployments (a rollout each time) in a loop with the first. Once the
// first's Lease has not been renewed for OwnerStale, the second takes the
// sale over.
func TestASecondInstallLeavesTheSaleAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.ownerStale = 3 * time.Second
	stopLeaseA := e.renewLease("install-a")
	e.renewLease("install-b")
	a, b := e.ns+"/install-a", e.ns+"/install-b"
	e.install, e.image = a, "flashsale-operator:a"
	stopA := e.startController()
	e.openSale("twice", 10)
	ownedBy := func(owner string) func(*flashsalev1alpha1.FlashSale) bool {
		return func(fs *flashsalev1alpha1.FlashSale) bool {
			return fs.Annotations[controllers.AnnotationOperator] == owner
		}
	}
	e.waitFor("twice", settle, "claimed by install a", ownedBy(a))
	image := func() string {
		d := &appsv1.Deployment{}
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "twice-reserve"}, d); err != nil {
			t.Fatal(err)
		}
		return d.Spec.Template.Spec.Containers[0].Image
	}
	if got := image(); got != "flashsale-operator:a" {
		t.Fatalf("the reserve Deployment runs %q", got)
	}

	e.install, e.image = b, "flashsale-operator:b"
	e.startController()
	if !hasEvent(t, e.ns, "twice", controllers.ReasonOperatorConflict) {
		t.Fatal("no OperatorConflict event from the second install")
	}
	// Its reconciles after the event, every ownerStale/2, write nothing either.
	time.Sleep(e.ownerStale)
	if got := image(); got != "flashsale-operator:a" {
		t.Fatalf("with a second install: the reserve Deployment runs %q", got)
	}
	if fs := e.get("twice"); !ownedBy(a)(fs) {
		t.Fatalf("owner %q", fs.Annotations[controllers.AnnotationOperator])
	}

	// The first install goes, and its Lease is no longer renewed.
	stopA()
	stopLeaseA()
	e.waitFor("twice", 30*time.Second, "taken over by install b", ownedBy(b))
	if !hasEvent(t, e.ns, "twice", controllers.ReasonOperatorChanged) {
		t.Fatal("no OperatorChanged event")
	}
	testharness.Eventually(t, settle, "the second install's image in the reserve Deployment", func() bool {
		return image() == "flashsale-operator:b"
	})

	// An install without leader election has no Lease to be known by: it
	// claims nothing, and leaves alone a sale a live install owns, rather
	// than take it, find no Lease of its own, and be taken from, in a loop.
	e.install, e.image = "", "flashsale-operator:c"
	e.startController()
	testharness.Eventually(t, settle, "an OperatorConflict event from the unnamed install", func() bool {
		return countEvents(t, e.ns, "twice", controllers.ReasonOperatorConflict) >= 2
	})
	time.Sleep(e.ownerStale)
	if got := image(); got != "flashsale-operator:b" {
		t.Fatalf("with an unnamed install: the reserve Deployment runs %q", got)
	}
	if fs := e.get("twice"); !ownedBy(b)(fs) {
		t.Fatalf("owner %q", fs.Annotations[controllers.AnnotationOperator])
	}
}
