package controllers

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

func TestSaleWindow(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(d)); return &t }
	for _, tc := range []struct {
		name   string
		sched  *flashsalev1alpha1.ScheduleSpec
		paused bool
		gate   string
		next   time.Duration
	}{
		{"no schedule", nil, false, stock.StateOpen, 0},
		{"no schedule, paused", nil, true, stock.StatePaused, 0},
		{"before start", &flashsalev1alpha1.ScheduleSpec{Start: at(20 * time.Second)}, false, stock.StateNotStarted, 20 * time.Second},
		{"before start, paused", &flashsalev1alpha1.ScheduleSpec{Start: at(time.Minute)}, true, stock.StateNotStarted, time.Minute},
		{"at start", &flashsalev1alpha1.ScheduleSpec{Start: at(0)}, false, stock.StateOpen, 0},
		{"between", &flashsalev1alpha1.ScheduleSpec{Start: at(-time.Minute), End: at(time.Hour)}, false, stock.StateOpen, time.Hour},
		{"between, paused", &flashsalev1alpha1.ScheduleSpec{Start: at(-time.Minute), End: at(time.Hour)}, true, stock.StatePaused, time.Hour},
		{"at end", &flashsalev1alpha1.ScheduleSpec{Start: at(-time.Hour), End: at(0)}, false, stock.StateEnded, 0},
		{"after end, paused", &flashsalev1alpha1.ScheduleSpec{End: at(-time.Second)}, true, stock.StateEnded, 0},
		{"end only, ahead", &flashsalev1alpha1.ScheduleSpec{End: at(time.Minute)}, false, stock.StateOpen, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &flashsalev1alpha1.FlashSaleSpec{Schedule: tc.sched, Paused: tc.paused}
			w := saleWindow(spec, now)
			if w.Gate != tc.gate || w.Next != tc.next {
				t.Fatalf("got %+v, want gate %s next %s", w, tc.gate, tc.next)
			}
		})
	}
}

func TestSalePhase(t *testing.T) {
	for _, tc := range []struct {
		gate                string
		available, reserved int64
		want                flashsalev1alpha1.FlashSalePhase
	}{
		{stock.StateNotStarted, 10, 0, flashsalev1alpha1.PhaseScheduled},
		{stock.StateOpen, 10, 3, flashsalev1alpha1.PhaseOpen},
		{stock.StateOpen, 0, 3, flashsalev1alpha1.PhaseSoldOut},
		{stock.StatePaused, 0, 3, flashsalev1alpha1.PhasePaused},
		{stock.StateEnded, 5, 3, flashsalev1alpha1.PhaseEnded},
		{stock.StateEnded, 5, 0, flashsalev1alpha1.PhaseCompleted},
	} {
		if got := salePhase(tc.gate, tc.available, tc.reserved); got != tc.want {
			t.Errorf("salePhase(%s, %d, %d) = %s, want %s", tc.gate, tc.available, tc.reserved, got, tc.want)
		}
	}
}

// A sale paused before its start is Scheduled until the start and Paused
// after: Admitting's message says both, so nobody waits for an opening that
// the pause holds back.
func TestGateMessageOfASalePausedBeforeItsStart(t *testing.T) {
	start := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	spec := &flashsalev1alpha1.FlashSaleSpec{Schedule: &flashsalev1alpha1.ScheduleSpec{Start: &metav1.Time{Time: start}}}
	if msg := gateMessage(stock.StateNotStarted, spec); strings.Contains(msg, "paused") {
		t.Errorf("not paused: %q", msg)
	}
	spec.Paused = true
	if msg := gateMessage(stock.StateNotStarted, spec); !strings.Contains(msg, "2026-12-01T09:00:00Z") || !strings.Contains(msg, "spec.paused is set") {
		t.Errorf("paused before the start: %q, want the start and the pause", msg)
	}
}
