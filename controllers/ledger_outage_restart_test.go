package controllers_test

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// A manager that starts while the ledger is down opens no connections, so
// its phases never run: what Redis lost meanwhile is read through Redis
// alone, and said (FailClosed, RedisDataLost) before the ledger answers.
func TestALossFoundByAManagerStartedWhileTheLedgerIsDown(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	stop := e.startController()
	e.openSale("restarted", 10)
	stop()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	e.startController()
	e.waitFor("restarted", settle, "failed closed, Redis's loss said", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseFailClosed &&
			reasonIs(flashsalev1alpha1.ConditionRedisHealthy, controllers.ReasonRedisDataLost)(fs) &&
			conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse)
	})
	time.Sleep(3 * time.Second) // reconciles while the ledger is down
	if n := countSent(t, e.ns, "restarted", controllers.ReasonRedisDataLost); n != 1 {
		t.Fatalf("%d RedisDataLost events sent while the ledger is down, want 1", n)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("restarted", 30*time.Second, "Open after the rebuild", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil && fs.Status.Available == 10
	})
}
