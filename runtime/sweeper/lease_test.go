package sweeper

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

var fastLease = LeaseTiming{LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 50 * time.Millisecond}

func TestLeaseOneLeaderAndHandOver(t *testing.T) {
	cs := fake.NewClientset()
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
