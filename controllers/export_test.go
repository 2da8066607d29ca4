package controllers

import (
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SecretReader is secretReader, for the tests outside the package.
type SecretReader = secretReader

func NewSecretReader(meta, api client.Reader) *SecretReader { return newSecretReader(meta, api) }

// Held is how many Secrets' data the reader holds.
func (r *SecretReader) Held() int { return r.held() }

// SetClock replaces the reader's clock.
func (r *SecretReader) SetClock(now func() time.Time) { r.now = now }

// SecretUnusedFor is how long a Secret nobody reads stays held.
const SecretUnusedFor = secretUnusedFor

// SetRebuildFailpoint makes fp run before each shard of a rebuild is
// finished, on the rebuild's goroutine: a test holds a rebuild there.
func SetRebuildFailpoint(r *FlashSaleReconciler, fp func(namespace, name string, shard int)) {
	r.rebuildFailpoint = fp
}

// SetRebuildStoppedFailpoint makes fp run when a rebuild is stopped (its
// connections replaced or closed), after its context is cancelled and
// before the stop waits for it.
func SetRebuildStoppedFailpoint(r *FlashSaleReconciler, fp func(namespace, name string)) {
	r.rebuildStoppedFailpoint = fp
}

// SetRebuildBegunFailpoint makes fp run once a rebuild's start is recorded,
// before it touches a shard, on the rebuild's goroutine.
func SetRebuildBegunFailpoint(r *FlashSaleReconciler, fp func(namespace, name string)) {
	r.rebuildBegunFailpoint = fp
}
