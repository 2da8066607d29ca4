package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// A rebuild that ends while the ledger takes no writes (a switchover
// during the rebuild) is recorded once the ledger takes them again: it is
// not run a second time, which would close the sale again, move the epoch
// on under the reservations of the first, and record that the sale
// "resumed after it failed closed" instead of why it was rebuilt.
func TestARebuildIsRecordedOnceTheLedgerTakesWrites(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	var once sync.Once
	// Before the rebuild's first shard is finished: its ledger read is done,
	// and the record it writes at its end is refused.
	e.rebuildFailpoint = func(_, sale string, shard int) {
		if sale == "blip" {
			once.Do(func() {
				if err := pg.SetReadOnly(true); err != nil {
					t.Error(err)
				}
			})
		}
	}
	e.startController()
	fs := e.openSale("blip", 100)
	eng := e.engineFor(fs, r.Addr())
	for i := range 3 {
		e.reserve(eng, fmt.Sprintf("u-%d", i))
	}
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("blip", settle, "the record refused", reasonIs(flashsalev1alpha1.ConditionLedgerHealthy, controllers.ReasonReadOnly))
	if err := pg.SetReadOnly(false); err != nil {
		t.Fatal(err)
	}
	fs = e.waitFor("blip", settle, "Open, the rebuild recorded", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil
	})
	if why := fs.Status.LastRebuild.Reason; strings.Contains(why, "resumed") {
		t.Fatalf("the rebuild recorded as %q, not why it ran", why)
	}
	ctx := context.Background()
	l, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	var epoch int64
	if err := l.QueryRow(ctx, `SELECT epoch FROM flashsale_campaigns WHERE campaign_id = $1`, string(fs.UID)).Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	if epoch != 2 || fs.Status.Epoch != 2 {
		t.Fatalf("one loss of Redis: ledger epoch %d, status epoch %d; want 2 (one rebuild)", epoch, fs.Status.Epoch)
	}
	// The recorder sends the event after the reconcile that wrote the status.
	if !hasEvent(t, e.ns, "blip", controllers.ReasonRebuilt) {
		t.Fatal("no Rebuilt event")
	}
	if n := countEvents(t, e.ns, "blip", controllers.ReasonRebuilt); n != 1 {
		t.Fatalf("%d Rebuilt events, want 1", n)
	}
}

// The same with the operator restarted before the ledger takes writes
// again: the new process has no memory of the run. It finds the shards
// whole at the epoch the rebuild began, on the servers they were written
// on, and records that rebuild instead of running another one.
func TestARebuildFinishedBeforeARestartIsRecordedNotRunAgain(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	var once sync.Once
	e.rebuildFailpoint = func(_, sale string, shard int) {
		if sale == "restart" {
			once.Do(func() {
				if err := pg.SetReadOnly(true); err != nil {
					t.Error(err)
				}
			})
		}
	}
	stop := e.startController()
	fs := e.openSale("restart", 100)
	eng := e.engineFor(fs, r.Addr())
	for i := range 3 {
		e.reserve(eng, fmt.Sprintf("u-%d", i))
	}
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("restart", settle, "the record refused", reasonIs(flashsalev1alpha1.ConditionLedgerHealthy, controllers.ReasonReadOnly))
	stop()
	e.startController()
	e.waitFor("restart", settle, "the new process finding the ledger read-only", reasonIs(flashsalev1alpha1.ConditionLedgerHealthy, controllers.ReasonReadOnly))
	if err := pg.SetReadOnly(false); err != nil {
		t.Fatal(err)
	}
	fs = e.waitFor("restart", settle, "Open, the rebuild recorded", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil
	})
	if why := fs.Status.LastRebuild.Reason; strings.Contains(why, "resumed") {
		t.Fatalf("the rebuild recorded as %q, not why it ran", why)
	}
	ctx := context.Background()
	l, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	var epoch int64
	if err := l.QueryRow(ctx, `SELECT epoch FROM flashsale_campaigns WHERE campaign_id = $1`, string(fs.UID)).Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	if epoch != 2 || fs.Status.Epoch != 2 || fs.Status.LastRebuild.Reserved != 3 {
		t.Fatalf("one loss of Redis: ledger epoch %d, status epoch %d, last rebuild %+v; want epoch 2 (one rebuild), 3 reserved",
			epoch, fs.Status.Epoch, fs.Status.LastRebuild)
	}
	if n := countEvents(t, e.ns, "restart", controllers.ReasonRebuilt); n != 1 {
		t.Fatalf("%d Rebuilt events, want 1", n)
	}
}
