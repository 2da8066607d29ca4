package controllers

import (
	"time"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// window is where a sale stands relative to its schedule and pause switch, at a
// given time. It decides the gate written to every shard.
type window struct {
	Gate string        // engine.StateOpen, StateNotStarted, StatePaused or StateEnded
	Next time.Duration // until the next schedule edge (0: none ahead)
}

// scheduleOf is the spec's start and end (zero: none).
func scheduleOf(spec *flashsalev1alpha1.FlashSaleSpec) (start, end time.Time) {
	if s := spec.Schedule; s != nil {
		if s.Start != nil {
			start = s.Start.Time
		}
		if s.End != nil {
			end = s.End.Time
		}
	}
	return start, end
}

// saleWindow is a pure function of the spec and the clock, so it is table-tested and
// the gates flip within a requeue of the schedule edges.
func saleWindow(spec *flashsalev1alpha1.FlashSaleSpec, now time.Time) window {
	start, end := scheduleOf(spec)
	switch {
	case !end.IsZero() && !now.Before(end):
		return window{Gate: engine.StateEnded}
	case !start.IsZero() && now.Before(start):
		return window{Gate: engine.StateNotStarted, Next: start.Sub(now)}
	}
	w := window{Gate: engine.StateOpen}
	if spec.Paused {
		w.Gate = engine.StatePaused
	}
	if !end.IsZero() {
		w.Next = end.Sub(now)
	}
	return w
}

// salePhase summarizes a sale that is seeded and consistent (not FailClosed or
// Rebuilding) from its gate and counts.
func salePhase(gate string, available, reserved int64) flashsalev1alpha1.FlashSalePhase {
	switch gate {
	case engine.StateNotStarted:
		return flashsalev1alpha1.PhaseScheduled
	case engine.StateEnded:
		if reserved == 0 {
			return flashsalev1alpha1.PhaseCompleted
		}
		return flashsalev1alpha1.PhaseEnded
	case engine.StatePaused:
		return flashsalev1alpha1.PhasePaused
	}
	if available == 0 {
		return flashsalev1alpha1.PhaseSoldOut
	}
	return flashsalev1alpha1.PhaseOpen
}
