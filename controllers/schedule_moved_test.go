package controllers_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A schedule moved past now closes an open sale, as a pipeline applying the
// next drop's manifest (a start later) or an old one (an end earlier) to a
// running sale does: that is a Warning naming the new start or end, not only
// a Normal GateChanged. What was sold and held stays. A paused sale gets no
// such Warning, nor does a sale whose end the clock reaches
// (TestScheduleGatesAndLifecycle).
func TestAScheduleMovedPastNowWarnsThatTheOpenSaleClosed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.apply(e.sale("moved", 20))
	fs := e.waitFor("moved", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	eng := e.engineFor(fs, sharedRedis.Addr())
	e.reserve(eng, "before")

	// Paused, then its start moved later: it was not selling, so no Warning.
	updateSpec(t, e.ns, "moved", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	e.waitFor("moved", settle, "Paused", phaseIs(flashsalev1alpha1.PhasePaused))
	start := time.Now().Add(time.Hour).Truncate(time.Second)
	setStart := func(start time.Time) {
		updateSpec(t, e.ns, "moved", func(fs *flashsalev1alpha1.FlashSale) {
			fs.Spec.Schedule = &flashsalev1alpha1.ScheduleSpec{Start: &metav1.Time{Time: start}}
		})
	}
	setStart(start)
	e.waitFor("moved", settle, "Scheduled", phaseIs(flashsalev1alpha1.PhaseScheduled))
	if n := countEvents(t, e.ns, "moved", controllers.ReasonStartMovedLater); n != 0 {
		t.Fatalf("%d StartMovedLater events for a paused sale", n)
	}

	// Open again (start in the past, not paused), then the start moved later.
	setStart(time.Now().Add(-time.Minute).Truncate(time.Second))
	updateSpec(t, e.ns, "moved", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = false })
	e.waitFor("moved", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	setStart(start)
	fs = e.waitFor("moved", settle, "Scheduled", phaseIs(flashsalev1alpha1.PhaseScheduled))
	if !hasEventSaying(t, e.ns, "moved", controllers.ReasonStartMovedLater, start.UTC().Format(time.RFC3339)) {
		t.Fatal("no StartMovedLater event naming the new start")
	}
	if r, err := eng.Reserve(context.Background(), "after", "r", 1); err != nil || r.Reason != stock.StateNotStarted {
		t.Fatalf("reserve after the start moved later: %+v %v, want refused as not started", r, err)
	}
	if fs.Status.Reserved != 1 || fs.Status.Available != 19 {
		t.Fatalf("status after the start moved later: %d reserved, %d available; want the reservation kept", fs.Status.Reserved, fs.Status.Available)
	}

	// Open again, then its end moved before now.
	past := time.Now().Add(-2 * time.Minute).Truncate(time.Second)
	setStart(past)
	e.waitFor("moved", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	end := past.Add(time.Minute)
	updateSpec(t, e.ns, "moved", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Schedule.End = &metav1.Time{Time: end} })
	fs = e.waitFor("moved", settle, "Ended", phaseIs(flashsalev1alpha1.PhaseEnded))
	if !hasEventSaying(t, e.ns, "moved", controllers.ReasonEndMovedEarlier, end.UTC().Format(time.RFC3339)) {
		t.Fatal("no EndMovedEarlier event naming the new end")
	}
	if r, err := eng.Reserve(context.Background(), "after-end", "r", 1); err != nil || r.Reason != stock.StateEnded {
		t.Fatalf("reserve after the end moved earlier: %+v %v, want refused as ended", r, err)
	}
	if fs.Status.Reserved != 1 {
		t.Fatalf("status after the end moved earlier: %d reserved; want the reservation kept", fs.Status.Reserved)
	}
	for _, reason := range []string{controllers.ReasonStartMovedLater, controllers.ReasonEndMovedEarlier} {
		for _, ev := range eventsAbout(t, e.ns, "moved", reason) {
			if ev.Type != corev1.EventTypeWarning {
				t.Fatalf("%s is %s, want a Warning", reason, ev.Type)
			}
		}
	}
}
