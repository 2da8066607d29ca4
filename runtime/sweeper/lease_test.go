package sweeper

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

var fastLease = LeaseTiming{LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 50 * time.Millisecond}

// steadyLease renews often but forgives a renewal that a loaded API server
// answers late: a hand-over is then by release, not by expiry.
var steadyLease = LeaseTiming{LeaseDuration: 8 * time.Second, RenewDeadline: 5 * time.Second, RetryPeriod: 50 * time.Millisecond}

func TestLeaseOneLeaderAndHandOver(t *testing.T) {
	testLeaseOneLeaderAndHandOver(t, fake.NewClientset())
}

// The same against a real API server, whose optimistic concurrency (resource
// versions) decides the races the fake client does not.
func TestLeaseOneLeaderAndHandOverAPIServer(t *testing.T) {
	k := testharness.KubeT(t)
	cs, err := kubernetes.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testLeaseOneLeaderAndHandOver(t, cs)
}

func testLeaseOneLeaderAndHandOver(t *testing.T, cs kubernetes.Interface) {
	ctx := context.Background()
	name := LeaseName("c-9")
	a, err := NewLease(cs, "shop", name, "a", steadyLease, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewLease(cs, "shop", name, "b", steadyLease, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Release(ctx) }()
	defer func() { _ = b.Release(ctx) }()

	leaders := func() (n int, who *Lease) {
		for _, l := range []*Lease{a, b} {
			if ok, _ := l.Acquire(ctx); ok {
				n, who = n+1, l
			}
		}
		return n, who
	}
	var leader *Lease
	waitFor(t, "a leader", func() bool {
		n, who := leaders()
		if n > 1 {
			t.Fatal("two leaders")
		}
		leader = who
		return n == 1
	})
	for range 20 {
		if n, who := leaders(); n != 1 || who != leader {
			t.Fatalf("leadership moved without a reason: %d leaders", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	lease, err := cs.CoordinationV1().Leases("shop").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != leader.id {
		t.Fatalf("the Lease names %v, the leader is %s", lease.Spec.HolderIdentity, leader.id)
	}

	// Release gives the Lease up; the other takes it well before it would
	// have expired.
	start := time.Now()
	if err := leader.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other := a
	if leader == a {
		other = b
	}
	waitFor(t, "the other replica to lead", func() bool { ok, _ := other.Acquire(ctx); return ok })
	if d := time.Since(start); d >= steadyLease.LeaseDuration {
		t.Fatalf("hand-over took %s: the Lease was not released", d)
	}
	if ok, _ := leader.Acquire(ctx); ok {
		t.Fatal("the released replica still leads")
	}
}

func TestLeaseNeedsNamespace(t *testing.T) {
	if _, err := NewLease(fake.NewClientset(), "", "n", "i", fastLease, nil); err == nil {
		t.Fatal("accepted an empty namespace")
	}
	if id := Identity(); !strings.Contains(id, "_") {
		t.Fatalf("identity %q lacks the pid", id)
	}
}

// A leader cut off from the API server (its Lease updates hang) stops
// reporting itself leader once it has gone RenewDeadline without renewing,
// before the other replica can take the Lease over (LeaseDuration after the
// last renewal): the two never both report leading. client-go's own IsLeader
// would say yes until its hung renewal returned.
func TestLeaseCutOffLeaderStepsDownBeforeTakeOver(t *testing.T) {
	// One store, two clients: a fake client runs its reactors under one lock,
	// so a's hung call must not be on b's client.
	cs := fake.NewClientset()
	aClient := &fake.Clientset{}
	aClient.AddReactor("*", "*", k8stesting.ObjectReaction(cs.Tracker()))
	cut, unblock := make(chan struct{}), make(chan struct{})
	aClient.PrependReactor("update", "leases", func(action k8stesting.Action) (bool, runtime.Object, error) {
		select {
		case <-cut:
		default:
			return false, nil, nil
		}
		l, ok := action.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if ok && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "a" {
			<-unblock // a partitioned connection: no answer
			return true, nil, errors.New("connection lost")
		}
		return false, nil, nil
	})
	ctx := context.Background()
	name := LeaseName("c-cut")
	a, err := NewLease(aClient, "shop", name, "a", fastLease, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewLease(cs, "shop", name, "b", fastLease, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(unblock)
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = a.Release(rctx)
		_ = b.Release(rctx)
	})
	waitFor(t, "a to lead", func() bool { ok, _ := a.Acquire(ctx); return ok })
	_, _ = b.Acquire(ctx) // b starts its election
	close(cut)
	deadline := time.Now().Add(10 * time.Second)
	for {
		aLeads, _ := a.Acquire(ctx)
		bLeads, _ := b.Acquire(ctx)
		switch {
		case aLeads && bLeads:
			t.Fatal("both replicas report leading")
		case bLeads:
			return // b took over after a stepped down
		case time.Now().After(deadline):
			t.Fatal("b did not take over within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
