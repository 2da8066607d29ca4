package controllers_test

import (
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// An edit that changes what the operator's connections are opened with (the
// allocation here) while the stock is rebuilt waits for the rebuild to end:
// replacing the connections would stop the rebuild and start it over, the
// sale closed all along, and report the second one's reason instead of the
// loss. Each shard is rebuilt once, at epoch 2, for the loss; the edit is
// applied after.
func TestEditDuringARebuildDoesNotRestartIt(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	var mu sync.Mutex
	finished := map[int]int{} // shard -> times its rebuild reached the finish
	held, let := e.holdRebuild("editing", 0)
	hold := e.rebuildFailpoint
	e.rebuildFailpoint = func(ns, sale string, shard int) {
		if sale == "editing" {
			mu.Lock()
			finished[shard]++
			mu.Unlock()
		}
		hold(ns, sale, shard)
	}
	e.startController()
	t.Cleanup(let) // before the manager stops, which waits for the rebuild
	e.openSale("editing", 40)
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	<-held
	updateSpec(t, e.ns, "editing", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Allocation = 60 })
	// The edit's reconcile runs while the rebuild is held.
	e.waitFor("editing", settle, "the edit seen during the rebuild", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
		return c != nil && c.Reason == controllers.ReasonRebuilding && c.ObservedGeneration == fs.Generation
	})
	let()
	fs := e.waitFor("editing", settle, "rebuilt, then the edit applied", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.LastRebuild != nil && fs.Status.Allocation == 60 && fs.Status.Phase == flashsalev1alpha1.PhaseOpen
	})
	if fs.Status.Epoch != 2 || strings.Contains(fs.Status.LastRebuild.Reason, "left being rebuilt") {
		t.Fatalf("epoch %d, last rebuild %+v: want one rebuild, at epoch 2, for the loss", fs.Status.Epoch, fs.Status.LastRebuild)
	}
	mu.Lock()
	defer mu.Unlock()
	for shard, n := range finished {
		if n != 1 {
			t.Fatalf("shard %d was rebuilt %d times: %v", shard, n, finished)
		}
	}
}

// A change of the stores' Secrets during a rebuild (a rotated password, a
// DSN moved to another host of the same database) replaces the
// connections, which stops the rebuild: the sale is rebuilt again, for the
// same loss, without a RebuildFailed or LedgerUnreachable Warning, a
// failure's wait, or a "context canceled" in its status.
func TestASecretChangedDuringARebuildRestartsItWithoutAFailure(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	held, let := e.holdRebuild("rotating", 0)
	e.rebuildStoppedFailpoint = func(_, sale string) {
		if sale == "rotating" {
			let() // stopped: the held shard's finish now meets the cancelled context
		}
	}
	e.startController()
	t.Cleanup(let)
	e.openSale("rotating", 40)
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	<-held
	e.setSecret("shop-ledger", "dsn", e.dsn+"&application_name=rotated")
	fs := e.waitFor("rotating", 2*settle, "rebuilt on the new connections", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.LastRebuild != nil && fs.Status.Phase == flashsalev1alpha1.PhaseOpen
	})
	if why := fs.Status.LastRebuild.Reason; !strings.Contains(why, "shards missing") {
		t.Fatalf("the rebuild recorded for %q, want the loss", why)
	}
	for _, reason := range []string{controllers.ReasonRebuildFailed, controllers.ReasonLedgerUnreachable} {
		if n := countEvents(t, e.ns, "rotating", reason); n != 0 {
			t.Fatalf("%d %s events for a rebuild stopped by a change of Secret", n, reason)
		}
	}
}
