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
// "resumed after it failed closed" instead of why it was rebuilt. With the
// operator restarted meanwhile, the new process has no memory of the run:
// it finds the shards whole at the epoch the rebuild began, on the servers
// that wrote them, and records that rebuild.
func TestARebuildIsRecordedOnceTheLedgerTakesWrites(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "same process", true: "operator restarted"}[restart], func(t *testing.T) {
			t.Parallel()
			pg := testharness.PostgresT(t)
			r := testharness.RedisT(t)
			e := newEnv(t, r.Addr(), pg)
			var once sync.Once
			// Before the rebuild's first shard is finished: its ledger read
			// is done, and the record it writes at its end is refused.
			e.rebuildFailpoint = func(_, sale string, shard int) {
				if sale == "blip" {
					once.Do(func() {
						if err := pg.SetReadOnly(true); err != nil {
							t.Error(err)
						}
					})
				}
			}
			stop := e.startController()
			fs := e.openSale("blip", 100)
			eng := e.engineFor(fs, r.Addr())
			for i := range 3 {
				e.reserve(eng, fmt.Sprintf("u-%d", i))
			}
			if err := r.RestartEmpty(); err != nil {
				t.Fatal(err)
			}
			e.waitFor("blip", settle, "the record refused", reasonIs(flashsalev1alpha1.ConditionLedgerHealthy, controllers.ReasonReadOnly))
			if restart {
				stop()
				e.startController()
				e.waitFor("blip", settle, "the new process finding the ledger read-only",
					reasonIs(flashsalev1alpha1.ConditionLedgerHealthy, controllers.ReasonReadOnly))
			}
			if err := pg.SetReadOnly(false); err != nil {
				t.Fatal(err)
			}
			fs = e.waitFor("blip", settle, "Open, the rebuild recorded", func(fs *flashsalev1alpha1.FlashSale) bool {
				return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil
			})
			if why := fs.Status.LastRebuild.Reason; strings.Contains(why, "resumed") {
				t.Fatalf("the rebuild recorded as %q, not why it ran", why)
			}
			if epoch := ledgerEpoch(t, e, fs); epoch != 2 || fs.Status.Epoch != 2 || fs.Status.LastRebuild.Reserved != 3 {
				t.Fatalf("one loss of Redis: ledger epoch %d, status epoch %d, last rebuild %+v; want epoch 2 (one rebuild), 3 reserved",
					epoch, fs.Status.Epoch, fs.Status.LastRebuild)
			}
			// The recorder sends the event after the reconcile that wrote the status.
			if !hasEvent(t, e.ns, "blip", controllers.ReasonRebuilt) {
				t.Fatal("no Rebuilt event")
			}
			if n := countEvents(t, e.ns, "blip", controllers.ReasonRebuilt); n != 1 {
				t.Fatalf("%d Rebuilt events, want 1", n)
			}
		})
	}
}

// ledgerEpoch is the sale's epoch in the ledger.
func ledgerEpoch(t *testing.T, e *env, fs *flashsalev1alpha1.FlashSale) int64 {
	t.Helper()
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
	return epoch
}
