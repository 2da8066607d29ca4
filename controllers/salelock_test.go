package controllers

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// One sale's reconciles wait for each other; another sale's do not, and a
// sale nobody reconciles holds no lock.
func TestSaleLocks(t *testing.T) {
	var l saleLocks
	a, b := types.NamespacedName{Namespace: "shop", Name: "a"}, types.NamespacedName{Namespace: "shop", Name: "b"}
	unlockA := l.lock(a)
	l.lock(b)() // another sale: not held up

	second := make(chan struct{})
	go func() {
		defer close(second)
		l.lock(a)()
	}()
	select {
	case <-second:
		t.Fatal("a second reconcile of the sale ran beside the first")
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	<-second
	if n := len(l.sales); n != 0 {
		t.Fatalf("%d locks kept after every reconcile ended", n)
	}
}
