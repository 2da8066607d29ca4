package controllers

import (
	"context"
	"errors"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// closeTimeout bounds a closing gate written ahead of the ledger phases.
const closeTimeout = 5 * time.Second

// closingContext bounds a closing gate write by closeTimeout, whatever is
// left of ctx: the reconcile's may be spent on a hung ledger.
func closingContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
}

// redisOnly is the sale's gates on a Redis client of its own, for closing
// the sale when its connections did not open because the ledger did not;
// done closes the client.
func redisOnly(fs *flashsalev1alpha1.FlashSale, refs *references) (gates *engine.Gates, done func()) {
	rdb := refs.redis.Client()
	return engine.RedisGates(rdb, string(fs.UID), int(resolve(fs).shards)), func() { _ = rdb.Close() }
}

// closeFirst writes the closing gate the spec asks for (paused, ended, not
// yet started) before any phase that needs the ledger. Closing needs only
// Redis, and a ledger that hangs or refuses the operator while the reserve
// pods may still reach it (a partition of the operator, its connections
// refused by a full PostgreSQL) must not keep a paused or ended sale
// selling. Opening waits for the ledger (applyGates).
func (r *FlashSaleReconciler) closeFirst(ctx context.Context, s *scope) (bool, error) {
	s.closed = r.closeShards(ctx, s, s.conn.engine.Gates())
	return false, nil
}

// closeShards writes the spec's closing gate on every shard that is OPEN
// (shards closed otherwise keep their state: failed closed, or a gate the
// schedule has moved past, which applyGates writes once the ledger answers),
// and returns the gate when every shard is known to hold it. A shard being
// rebuilt is left to the rebuild, which opens it in the gate of its moment.
func (r *FlashSaleReconciler) closeShards(ctx context.Context, s *scope, store *engine.Gates) string {
	now := r.now()
	gate := saleWindow(&s.fs.Spec, now).Gate
	// The read has a context of its own: one that hangs must not spend the
	// write's time.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout/2)
	states, err := store.ShardStates(rctx)
	rcancel()
	ctx, cancel := closingContext(ctx)
	defer cancel()
	windowWritten := false
	if err == nil {
		// The schedule needs no ledger either: a change of it reaches the
		// shards, which enforce it, while the ledger does not answer.
		if werr := writeSchedule(ctx, s, store, states); werr != nil {
			log.FromContext(ctx).Error(werr, "writing the schedule into the shards")
		} else {
			// The shards enforce the new window from now, closed by the gate
			// below or not: said now, as the next reconcile reads the new
			// window and cannot tell.
			windowWritten = true
			warnWindowMoved(s, gate, states, now)
		}
	}
	if gate == engine.StateOpen {
		return ""
	}
	// others: every shard that is not OPEN holds the gate already. Not known
	// when the state could not be read.
	open, others := false, err == nil
	for _, st := range states {
		switch {
		case st.State == engine.StateOpen:
			open = true
		case st.State != gate:
			others = false
		}
	}
	s.held = heldUnits(states)
	if err == nil && !open {
		if others {
			return gate
		}
		return ""
	}
	// Any epoch: closing is right whoever seeded or rebuilt the shard.
	out, err := store.CloseOpen(ctx, gate)
	if err != nil {
		log.FromContext(ctx).Error(err, "closing the sale", "gate", gate)
		return ""
	}
	if i := slices.IndexFunc(out, func(n int) bool { return n != engine.GateSet }); i >= 0 {
		log.FromContext(ctx).Info("a shard was not closed (no meta, or being rebuilt)", "gate", gate, "shard", i, "outcome", out[i])
		return ""
	}
	s.event(corev1.EventTypeNormal, ReasonGateChanged, "Gate set to %s on every open shard", gate)
	if !windowWritten {
		warnWindowMoved(s, gate, states, now)
	}
	if !others {
		return ""
	}
	return gate
}

// warnWindowMoved says so when closing open shards that were selling by the
// window they held (states, read before this reconcile wrote the spec's):
// the schedule was moved past now by an edit, not reached by the clock. A
// pipeline that applies the next drop's manifest, or an old one, to a
// running sale stops the selling, which a Normal GateChanged alone would not
// make anyone look at.
func warnWindowMoved(s *scope, gate string, states []engine.ShardState, now time.Time) {
	if !slices.ContainsFunc(states, func(st engine.ShardState) bool {
		return st.Present && st.State == engine.StateOpen && st.OutsideWindow(now) == ""
	}) {
		return
	}
	start, end := scheduleOf(&s.fs.Spec)
	switch gate {
	case engine.StateNotStarted:
		s.event(corev1.EventTypeWarning, ReasonStartMovedLater,
			"the sale was open and spec.schedule.start is now %s, later than now: every shard refuses reservations until then; units sold and reservations held are kept",
			start.UTC().Format(time.RFC3339))
	case engine.StateEnded:
		s.event(corev1.EventTypeWarning, ReasonEndMovedEarlier,
			"the sale was open and spec.schedule.end is now %s, earlier than now: the sale has ended; units sold and reservations held are kept",
			end.UTC().Format(time.RFC3339))
	}
}

// closedPhase is the phase of shards closed by gate when observe could not
// run, from what this reconcile found: every shard holds gate (so none is
// failed closed or being rebuilt; computeStatus says FailClosed or Rebuilding
// from the facts that found them), and held units are reserved in Redis.
//
// Completed needs the ledger's pending orders too, which observe could not
// read: a sale reported Completed (was) stays so while Redis holds no
// reservation, the one thing Redis can tell; any reservation there refutes it.
// Once Completed nothing changes any more (the gate stays ENDED), so this is
// the report of a fact observed before, not a decision.
func closedPhase(gate string, held int64, was flashsalev1alpha1.FlashSalePhase) flashsalev1alpha1.FlashSalePhase {
	switch {
	case gate == engine.StatePaused:
		return flashsalev1alpha1.PhasePaused
	case gate == engine.StateNotStarted:
		return flashsalev1alpha1.PhaseScheduled
	case was == flashsalev1alpha1.PhaseCompleted && held == 0:
		return was
	}
	return flashsalev1alpha1.PhaseEnded
}

// heldUnits is the units the shards hold in RESERVED reservations.
func heldUnits(states []engine.ShardState) int64 {
	var n int64
	for _, st := range states {
		n += st.Reserved
	}
	return n
}

// applyGates writes the gate the schedule and the pause switch ask for into every
// shard whose meta says otherwise.
func (r *FlashSaleReconciler) applyGates(ctx context.Context, s *scope) (bool, error) {
	// The window of now, not of the reconcile's start: the phases before may
	// have waited on a slow ledger across a schedule edge.
	s.now = r.now()
	s.window = saleWindow(&s.fs.Spec, s.now)
	if s.window.Gate != s.closed {
		s.closed = "" // the schedule moved on since closeFirst
	}
	states, err := s.conn.engine.Gates().ShardStates(ctx)
	if err != nil {
		r.unhealthy(s, err)
		return true, nil
	}
	if err := writeSchedule(ctx, s, s.conn.engine.Gates(), states); err != nil {
		r.unhealthy(s, err)
		return true, nil
	}
	for _, st := range states {
		if st.State == s.window.Gate {
			continue
		}
		err := s.conn.engine.SetGate(ctx, s.window.Gate, s.epoch)
		if errors.Is(err, engine.ErrFailedClosed) {
			// Failed closed since this reconcile found the shards live (the
			// gate leaves them so): the next one rebuilds them.
			s.requeueAfter(time.Millisecond)
			return true, nil
		}
		if err != nil {
			r.unhealthy(s, err)
			return true, nil
		}
		if s.window.Gate != engine.StateOpen {
			s.closed, s.held = s.window.Gate, heldUnits(states)
		}
		s.event(corev1.EventTypeNormal, ReasonGateChanged, "Gate set to %s on every shard", s.window.Gate)
		break
	}
	if s.window.Next > 0 {
		s.requeueAfter(s.window.Next)
	}
	return false, nil
}

// writeSchedule writes the spec's start and end into the shards whose meta
// holds another window: in closeFirst, which needs no ledger, and again in
// applyGates before any gate opens them. The reserve script
// refuses outside it by the Redis clock whatever the gate, so that a sale
// ends on time with no operator there to close it (down, without a leader,
// cut off from Redis) and does not open early on a manager whose clock is
// ahead: of the two clocks the earlier ends the sale, the later opens it.
func writeSchedule(ctx context.Context, s *scope, store *engine.Gates, states []engine.ShardState) error {
	start, end := scheduleOf(&s.fs.Spec)
	for _, st := range states {
		if st.Present && !st.HasWindow(start, end) {
			_, err := store.SetWindow(ctx, start, end)
			return err
		}
	}
	return nil
}
