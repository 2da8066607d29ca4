package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// A rebuild that fails for a reason a person must mend (the ledger's
// counters drifted from its orders) is tried again at lengthening
// intervals, 3 s and then 6 s and more, not every 3 s: each try moves the
// epoch on and reads the whole ledger. The waits are asserted as lower
// bounds only: a slow host makes them longer, never shorter.
func TestFailedRebuildsBackOff(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	e.startController()
	fs := e.openSale("drift", 100)
	eng := e.engineFor(fs, r.Addr())
	for i := range 3 {
		e.reserve(eng, fmt.Sprintf("u-%d", i))
	}
	ctx := context.Background()
	l, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	if tag, err := l.Exec(ctx, `UPDATE flashsale_shard_counts SET pending = pending + 1
WHERE ctid = (SELECT ctid FROM flashsale_shard_counts WHERE campaign_id = $1 AND pending > 0 LIMIT 1)`, string(fs.UID)); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("a pending count made one too many: %v %v", tag, err)
	}
	epoch := func() int64 {
		var n int64
		if err := l.QueryRow(ctx, `SELECT epoch FROM flashsale_campaigns WHERE campaign_id = $1`, string(fs.UID)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	start := epoch()
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	// When each try began: the epoch it moved on to, seen within 20 ms.
	var began []time.Time
	for n := start + 1; n <= start+3; n++ {
		testharness.Eventually(t, time.Minute, fmt.Sprintf("rebuild try %d", n-start), func() bool { return epoch() >= n })
		began = append(began, time.Now())
		if epoch() > n {
			t.Fatalf("two tries between two looks 20 ms apart (epoch %d, want %d)", epoch(), n)
		}
	}
	const slack = 250 * time.Millisecond
	for i, want := range []time.Duration{3 * time.Second, 6 * time.Second} {
		if gap := began[i+1].Sub(began[i]); gap < want-slack {
			t.Fatalf("try %d came %s after try %d, want at least %s", i+2, gap.Round(time.Millisecond), i+1, want)
		}
	}
	e.waitFor("drift", settle, "RebuildFailed, LedgerHealthy CountsDrift", func(fs *flashsalev1alpha1.FlashSale) bool {
		return reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonRebuildFailed)(fs) &&
			reasonIs(flashsalev1alpha1.ConditionLedgerHealthy, controllers.ReasonCountsDrift)(fs)
	})
}

// A rebuild that fails for a passing reason (Redis gone during it) is
// tried again soon, and its Warning does not count it among failures in a
// row: only lasting ones back off and are counted.
func TestAPassingRebuildFailureIsNotCountedInARow(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	var once sync.Once
	e.rebuildFailpoint = func(_, sale string, shard int) {
		if sale == "passing" {
			once.Do(func() {
				if err := r.Kill(); err != nil {
					t.Error(err)
				}
			})
		}
	}
	e.startController()
	fs := e.openSale("passing", 100)
	eng := e.engineFor(fs, r.Addr())
	e.reserve(eng, "u-0")
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	if !hasEvent(t, e.ns, "passing", controllers.ReasonRebuildFailed) {
		t.Fatal("no RebuildFailed event")
	}
	var list corev1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range list.Items {
		if ev.Reason == controllers.ReasonRebuildFailed && strings.Contains(ev.Message, "in a row") {
			t.Fatalf("a passing failure counted among failures in a row: %s", ev.Message)
		}
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("passing", 2*settle, "Open again", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil
	})
}
