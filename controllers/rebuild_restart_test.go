package controllers_test

import (
	"sync/atomic"
	"testing"
	"time"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// A Redis that restarts empty again after the reconcile read the servers
// for a rebuild, and before the rebuild began on them, is rebuilt on as it
// is: the rebuild records the servers it wrote to, so the sale it opened is
// not failed closed again as a new loss, with a second RedisDataLost and a
// rebuild at another epoch.
func TestARedisRestartedBeforeTheRebuildReachedItIsNoNewLoss(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	var restarted atomic.Bool
	e.rebuildBegunFailpoint = func(_, sale string) {
		if sale == "twice" && restarted.CompareAndSwap(false, true) {
			if err := r.RestartEmpty(); err != nil {
				t.Error(err)
			}
		}
	}
	e.startController()
	e.openSale("twice", 10)
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("twice", settle, "rebuilt at epoch 2, open", func(fs *flashsalev1alpha1.FlashSale) bool {
		return restarted.Load() && fs.Status.Epoch == 2 && fs.Status.Phase == flashsalev1alpha1.PhaseOpen
	})
	// The reconciles after the rebuild (one a second) find no new loss.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if fs := e.get("twice"); fs.Status.Epoch != 2 || fs.Status.Phase != flashsalev1alpha1.PhaseOpen {
			t.Fatalf("after the rebuild: epoch %d, phase %s; want 2, Open", fs.Status.Epoch, fs.Status.Phase)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := countSent(t, e.ns, "twice", controllers.ReasonRedisDataLost); n != 1 {
		t.Fatalf("%d RedisDataLost events, want 1", n)
	}
}
