package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// saleLocks keeps one sale's reconciles one at a time. The controller's
// queue never runs two at once for a sale, and what a sale's connections
// hold between reconciles (the run ids verified, a replacement being
// opened) relies on that; the lock makes it hold for a Reconcile called
// from anywhere else too.
type saleLocks struct {
	mu    sync.Mutex
	sales map[types.NamespacedName]*saleLock
}

type saleLock struct {
	sync.Mutex
	users int // reconciles holding or waiting for it
}

// lock takes the sale's lock and returns what releases it.
func (l *saleLocks) lock(name types.NamespacedName) (unlock func()) {
	l.mu.Lock()
	if l.sales == nil {
		l.sales = map[types.NamespacedName]*saleLock{}
	}
	s := l.sales[name]
	if s == nil {
		s = &saleLock{}
		l.sales[name] = s
	}
	s.users++
	l.mu.Unlock()
	s.Lock()
	return func() {
		s.Unlock()
		l.mu.Lock()
		if s.users--; s.users == 0 {
			delete(l.sales, name)
		}
		l.mu.Unlock()
	}
}
