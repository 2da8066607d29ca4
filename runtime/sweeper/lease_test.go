package sweeper

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

var fastLease = LeaseTiming{LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 50 * time.Millisecond}

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
	a, err := NewLease(cs, "shop", name, "a", fastLease, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewLease(cs, "shop", name, "b", fastLease, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	defer b.Release(ctx)

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
	if d := time.Since(start); d >= fastLease.LeaseDuration {
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
