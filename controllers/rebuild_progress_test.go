package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// While a rebuild runs, the status says so and how far it got: held before
// shard 2 of 4 is finished, the sale shows Rebuilding with 2 of 4 shards
// done, read from the ledger and the shards by the reconciles that run
// meanwhile. Let go, it opens, lastRebuild records the orders restored and
// the duration, the progress is gone, and an event says how long it took.
func TestRebuildProgressInStatus(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	held, let := e.holdRebuild("progress", 2)
	e.startController()
	// Before the manager stops (cleanups run last first): it waits for the rebuild.
	t.Cleanup(let)
	fs := e.openSale("progress", 40)
	eng := e.engineFor(fs, r.Addr())
	ctx := context.Background()
	for i := range 6 {
		res := e.reserve(eng, fmt.Sprintf("p-%d", i))
		if i < 2 {
			if _, err := eng.Checkout(ctx, fmt.Sprintf("p-%d", i), res.ID, "pay"); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.waitFor("progress", settle, "counts", func(fs *flashsalev1alpha1.FlashSale) bool { return fs.Status.Sold == 2 && fs.Status.Reserved == 4 })
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}

	<-held
	fs = e.waitFor("progress", settle, "Rebuilding, 2 of 4 shards done", func(fs *flashsalev1alpha1.FlashSale) bool {
		p := fs.Status.RebuildProgress
		if p != nil && p.ShardsDone > 2 {
			t.Fatalf("%d shards done while shards 2 and 3 are held", p.ShardsDone)
		}
		return fs.Status.Phase == flashsalev1alpha1.PhaseRebuilding && p != nil && p.ShardsDone == 2
	})
	p := fs.Status.RebuildProgress
	if p.Shards != 4 || p.Epoch != 2 || p.StartedAt == nil {
		t.Fatalf("rebuild progress %+v", p)
	}
	ready := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
	if ready == nil || ready.Reason != controllers.ReasonRebuilding || !strings.Contains(ready.Message, "2 of 4 shards done") {
		t.Fatalf("Ready while rebuilding: %+v", ready)
	}
	if fs.Status.LastRebuild != nil || countEvents(t, e.ns, "progress", controllers.ReasonRebuilt) != 0 {
		t.Fatalf("a rebuild reported over while it is held: %+v", fs.Status.LastRebuild)
	}

	let()
	fs = e.waitFor("progress", settle, "Open after the rebuild", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil
	})
	if fs.Status.RebuildProgress != nil {
		t.Fatalf("rebuild progress once over: %+v", fs.Status.RebuildProgress)
	}
	lr := fs.Status.LastRebuild
	if lr.RestoredOrders != 4 || lr.Reserved != 4 || lr.Sold != 2 || lr.Available != 34 || lr.DurationSeconds == "" || lr.DurationSeconds == "0.000" {
		t.Fatalf("lastRebuild %+v", lr)
	}
	if !hasEventSaying(t, e.ns, "progress", controllers.ReasonRebuilt, "Rebuilt the stock from the ledger in ") {
		t.Fatal("no event saying the rebuild ended and how long it took")
	}
	if fs.Status.Epoch != 2 || fs.Status.Available != 34 || fs.Status.Reserved != 4 || fs.Status.Sold != 2 {
		t.Fatalf("counts after the rebuild %+v", fs.Status)
	}
}
