package controllers_test

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// A ledger whose clock leaves Redis's is reported: ClocksInStep turns False
// with the difference and the server, a ClockSkew Warning says when, and
// both turn back once the clocks agree. The sale stays Ready throughout.
func TestClocksApartAreReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	shift := testharness.SkewClock(context.Background(), t, e.dsn)
	e.startController()
	e.openSale("clocks", 10)
	markReady(t, e.ns, "clocks-reserve")
	markReady(t, e.ns, "clocks-sweeper")
	e.waitFor("clocks", settle, "Ready", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonReady))
	e.waitFor("clocks", settle, "ClocksInStep True", reasonIs(flashsalev1alpha1.ConditionClocksInStep, controllers.ReasonInStep))

	says := func(text string) func(*flashsalev1alpha1.FlashSale) bool {
		return func(fs *flashsalev1alpha1.FlashSale) bool {
			c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionClocksInStep)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == controllers.ReasonClockSkew && strings.Contains(c.Message, text)
		}
	}
	shift("5 seconds")
	fs := e.waitFor("clocks", settle, "ClocksInStep False, the ledger 5s ahead",
		says("PostgreSQL's clock is 5s ahead of Redis "+e.redisAddr+"'s (this sale tolerates 1s, and counts them in step again under 500ms): every reservation (reservation.ttl 1m0s) has 5s less"))
	if !conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue) {
		t.Fatalf("Ready is not True beside the clocks' skew: %+v", meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady))
	}
	if !hasEventSaying(t, e.ns, "clocks", controllers.ReasonClockSkew, "5s ahead") {
		t.Fatal("no ClockSkew event")
	}

	shift("0")
	e.waitFor("clocks", settle, "ClocksInStep True again", reasonIs(flashsalev1alpha1.ConditionClocksInStep, controllers.ReasonInStep))
	if !hasEventSaying(t, e.ns, "clocks", controllers.ReasonClockSkewCleared, "agree within 1s") {
		t.Fatal("no ClockSkewCleared event")
	}

	// Apart again, the other way, within seconds: the new Warning says so,
	// not the first one's figure again.
	shift("-3 seconds")
	e.waitFor("clocks", settle, "ClocksInStep False, the ledger 3s behind", says("3s behind"))
	if !hasEventSaying(t, e.ns, "clocks", controllers.ReasonClockSkew, "3s behind") {
		t.Fatal("no ClockSkew event saying 3s behind (the events of the first skew's series only?)")
	}
}
