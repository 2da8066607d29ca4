package controllers

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// applyAllocation brings the allocation to spec.allocation exactly once: a raise
// adds units (restock); a decrease takes units out of available stock, and is
// refused while it would fall below the units sold and reserved.
func (r *FlashSaleReconciler) applyAllocation(ctx context.Context, s *scope) (bool, error) {
	eng := s.conn.engine
	want := s.fs.Spec.Allocation
	// Reads work on a ledger that takes no writes (a standby, a demoted
	// primary): it is asked whether it does before it is called healthy.
	if err := eng.PingLedger(ctx); err != nil {
		r.unhealthy(s, classify(err))
		return true, nil
	}
	inEffect, err := eng.Allocation(ctx)
	if err != nil {
		r.unhealthy(s, classify(err))
		return true, nil
	}
	s.ledgerOK = true
	// A spec that is refused or still being applied is not observed: the
	// generation stays unobserved until it is in effect.
	refuse := func(sold, reserved int64) {
		msg := fmt.Sprintf("allocation %d refused: %d units are sold and %d reserved; allocation %d stays in effect", want, sold, reserved, inEffect)
		// One event per refused spec: the counts in the message change with
		// every reservation.
		if cond := meta.FindStatusCondition(s.fs.Status.Conditions, ConditionAllocationApplied); cond == nil ||
			cond.Reason != ReasonAllocationRefused || cond.ObservedGeneration != s.fs.Generation {
			s.statusEvent(corev1.EventTypeWarning, ReasonAllocationRefused, "%s", msg)
		}
		s.allocation = &allocationVerdict{reason: ReasonAllocationRefused, message: msg}
	}
	// A decrease whose outcome was lost landed meanwhile: the next try
	// starts from the ledger's allocation.
	retried := func(err error) {
		s.allocation = &allocationVerdict{reason: ReasonAllocationChanged,
			message: fmt.Sprintf("allocation %d: retried, an earlier change landed meanwhile: %v", want, err)}
		s.requeueAfter(retryUnhealthy)
	}
	if want < inEffect {
		counts, err := eng.Counts(ctx)
		if err != nil {
			r.unhealthy(s, classify(err))
			return true, nil
		}
		if want < counts.Sold+counts.Reserved {
			// Units withdrawn by an earlier attempt go back to the stock.
			if _, err := eng.ApplyAllocation(ctx, inEffect); errors.Is(err, engine.ErrAllocationMoved) {
				retried(err)
				return false, nil
			} else if err != nil {
				r.unhealthy(s, classify(err))
				return true, nil
			}
			refuse(counts.Sold, counts.Reserved)
			return false, nil
		}
	}
	changed, err := eng.ApplyAllocation(ctx, want)
	switch {
	case errors.Is(err, engine.ErrBelowHeld):
		counts, cerr := eng.Counts(ctx)
		if cerr != nil {
			// The refusal is sure; its counts are not: no message with zeros.
			r.unhealthy(s, classify(cerr))
			return true, nil
		}
		refuse(counts.Sold, counts.Reserved)
		return false, nil
	case errors.Is(err, engine.ErrAllocationPending):
		msg := fmt.Sprintf("lowering the allocation to %d: %v; it completes as reserved units are released", want, err)
		// Not Ready either: a pipeline waiting on Ready waits for the change.
		s.allocation = &allocationVerdict{reason: ReasonAllocationPending, message: msg}
		s.requeueAfter(retryUnhealthy)
		return false, nil
	case errors.Is(err, engine.ErrRebuilt), errors.Is(err, engine.ErrEpochChanged):
		// A rebuild ran meanwhile (another operator's, during a leadership
		// handover): the change is applied over its result at the next try.
		s.allocation = &allocationVerdict{reason: ReasonAllocationRetried,
			message: fmt.Sprintf("allocation %d: retried after a rebuild of the shards: %v", want, err)}
		s.requeueAfter(retryUnhealthy)
		return false, nil
	case errors.Is(err, engine.ErrAllocationMoved):
		retried(err)
		return false, nil
	case err != nil:
		r.unhealthy(s, classify(err))
		return true, nil
	}
	switch {
	case changed && want > inEffect:
		s.event(corev1.EventTypeNormal, ReasonRestocked, "Added %d units: allocation %d → %d", want-inEffect, inEffect, want)
	case changed && want < inEffect:
		s.event(corev1.EventTypeNormal, ReasonAllocationLowered, "Removed %d units from available stock: allocation %d → %d", inEffect-want, inEffect, want)
	}
	s.allocation = &allocationVerdict{applied: true, reason: ReasonApplied, message: fmt.Sprintf("allocation %d is in effect", want)}
	return false, nil
}
