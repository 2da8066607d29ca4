package controllers_test

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// A ledger that answers reads but takes no writes (a primary demoted in a
// switchover keeps its sessions; a multi-host DSN may land on a standby):
// every reservation fails, so the sale is not reported healthy and
// admitting, though every query the operator makes of a live sale is a
// read. Writable again, it is healthy again, without a restart.
func TestALedgerThatTakesNoWritesIsNotHealthy(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	e := newEnv(t, sharedRedis.Addr(), pg)
	e.startController()
	e.openSale("readonly", 10)
	markReady(t, e.ns, "readonly-reserve") // buyers reach it: Admitting once the ledger takes writes
	if err := pg.SetReadOnly(true); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("readonly", settle, "LedgerHealthy ReadOnly", reasonIs(flashsalev1alpha1.ConditionLedgerHealthy, controllers.ReasonReadOnly))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "takes no writes") {
		t.Fatalf("LedgerHealthy while the ledger takes no writes: %+v", c)
	}
	e.waitFor("readonly", settle, "Ready LedgerReadOnly, not admitting", func(fs *flashsalev1alpha1.FlashSale) bool {
		return reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonLedgerReadOnly)(fs) &&
			conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse)
	})
	if !hasEvent(t, e.ns, "readonly", controllers.ReasonLedgerReadOnly) {
		t.Fatal("no event when the ledger stopped taking writes")
	}
	if err := pg.SetReadOnly(false); err != nil {
		t.Fatal(err)
	}
	e.waitFor("readonly", 30*time.Second, "healthy and admitting again", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue) &&
			conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionTrue)
	})
	if !hasEvent(t, e.ns, "readonly", controllers.ReasonLedgerRecovered) {
		t.Fatal("no event when the ledger took writes again")
	}
}
