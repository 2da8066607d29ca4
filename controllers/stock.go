package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// ensureStock seeds a new sale once, and detects and repairs Redis data loss: shards
// without meta, a stale epoch, or a Redis server that restarted. Loss first shows
// as FailClosed (every shard refuses), then the next reconcile rebuilds from the
// ledger.
func (r *FlashSaleReconciler) ensureStock(ctx context.Context, s *scope) (bool, error) {
	eng := s.conn.engine
	lost, why := false, ""
	// firstSeed: the sale never showed as seeded. Shards missing then are most
	// likely a first seeding cut short (an operator restart, a Redis refusal
	// fixed since): they are written from the ledger as a rebuild would, and
	// reported as data loss only if the ledger shows the sale had taken
	// reservations.
	firstSeed := false
	res, err := eng.SeedSale(ctx, s.window.Gate, s.fs.Status.Epoch > 0)
	switch {
	case errors.Is(err, engine.ErrNeedsRebuild):
		lost, why = true, err.Error()
		firstSeed = s.fs.Status.Epoch == 0 && !meta.IsStatusConditionTrue(s.fs.Status.Conditions, flashsalev1alpha1.ConditionSeeded)
	case errors.Is(err, engine.ErrLedgerMismatch):
		// Neither seeded nor rebuilt: either would trust a ledger that does
		// not hold what was sold. Pods writing to it are fenced (no campaign).
		if c := meta.FindStatusCondition(s.fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c == nil || c.Reason != ReasonLedgerMismatch {
			s.statusEvent(corev1.EventTypeWarning, ReasonLedgerMismatch, "%s", err.Error())
		}
		s.condition(flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse, ReasonMismatch, err.Error())
		s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, ReasonLedgerMismatch, err.Error())
		s.condition(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonUnhealthy, "reservations cannot be recorded: "+err.Error())
		s.requeueAfter(retryUnhealthy)
		return true, nil
	case err != nil:
		r.unhealthy(s, classify(err))
		return true, nil
	}
	s.epoch = res.Campaign.Epoch
	if res.Seeded > 0 {
		s.event(corev1.EventTypeNormal, ReasonSeeded, "Seeded %d units into %d Redis shards (epoch %d)", res.Campaign.Allocation, res.Seeded, res.Campaign.Epoch)
	}
	srv, err := eng.Store().Servers(ctx)
	if err != nil {
		r.unhealthy(s, err)
		return true, nil
	}
	ids := srv.RunIDs
	if !lost {
		why, lost = s.conn.runIDsChanged(s.fs.Status.RedisServers, ids)
	}
	phase := s.fs.Status.Phase
	if !lost && s.conn.rebuiltEpoch == res.Campaign.Epoch && s.conn.rebuiltEpoch > 0 &&
		(phase == flashsalev1alpha1.PhaseFailClosed || phase == flashsalev1alpha1.PhaseRebuilding) {
		// This connection rebuilt the shards at the ledger's epoch and nothing
		// is lost since: the phase read is older than that rebuild's status
		// write (a cache that has not caught up), not a reason to rebuild again.
		phase = ""
	}
	needsRebuild := lost || phase == flashsalev1alpha1.PhaseFailClosed || phase == flashsalev1alpha1.PhaseRebuilding
	if needsRebuild && !firstSeed && phase != flashsalev1alpha1.PhaseFailClosed && phase != flashsalev1alpha1.PhaseRebuilding {
		// Close every shard at once (shards without meta already refuse), say so, and
		// rebuild on the next reconcile, right after this status is written.
		// On a context of its own: a slow ledger may have spent the phase's.
		cctx, cancel := closingContext(ctx)
		_, _ = eng.Store().SetGate(cctx, stock.StateFailClosed, 0)
		cancel()
		s.fs.Status.Phase = flashsalev1alpha1.PhaseFailClosed
		msg := "Redis lost the sale's state (" + why + "); every shard refuses reservations until the stock is rebuilt from the ledger"
		s.condition(flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse, ReasonRedisDataLost, msg)
		s.condition(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonFailClosed, msg)
		s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, ReasonFailClosed, msg)
		// Found against the status read (its phase, its servers' run ids):
		// a stale read finds the same loss again and must not say it twice.
		s.statusEvent(corev1.EventTypeWarning, ReasonRedisDataLost, "%s", msg)
		s.result.RequeueAfter = time.Millisecond
		return true, nil
	}
	if needsRebuild {
		// The shards open in the state of the moment they open (applyGates
		// recomputes the window too): a rebuild of a large ledger may run
		// across a schedule edge.
		// Not bounded by the phase: a rebuild reads every live order.
		rep, err := eng.Rebuild(s.unbounded, func() string { return saleWindow(&s.fs.Spec, r.now()).Gate })
		if err != nil {
			err = classify(err)
			msg := "rebuild from the ledger failed, the sale stays closed: " + err.Error()
			s.condition(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, ReasonRebuildFailed, msg)
			s.condition(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonFailClosed, msg)
			var le *ledgerError
			if errors.As(err, &le) {
				s.ledgerDown = true
				s.condition(flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse, ReasonUnreachable, err.Error())
			} else {
				s.fs.Status.Phase = flashsalev1alpha1.PhaseRebuilding
			}
			s.event(corev1.EventTypeWarning, ReasonRebuildFailed, "%s", msg)
			s.requeueAfter(retryUnhealthy)
			return true, nil
		}
		// The rest of the phase gets a bound of its own: the rebuild may
		// have outlasted the phase's.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(s.unbounded, r.phaseTimeout())
		defer cancel()
		s.epoch = rep.Epoch
		s.conn.rebuiltEpoch = rep.Epoch
		s.fs.Status.Phase = salePhase(rep.Gate, rep.Available, rep.Reserved)
		if firstSeed && rep.Reserved == 0 && rep.Sold == 0 {
			s.event(corev1.EventTypeNormal, ReasonSeeded, "Seeded %d units into %d Redis shards (epoch %d), completing a first seeding that was cut short (%s)",
				s.fs.Spec.Allocation, resolve(s.fs).shards, rep.Epoch, why)
			return r.afterSeed(ctx, s, ids, srv)
		}
		if firstSeed {
			s.event(corev1.EventTypeWarning, ReasonRedisDataLost, "Redis lost the sale's state (%s) before the operator recorded it as seeded; rebuilt from the ledger", why)
		}
		s.fs.Status.LastRebuild = &flashsalev1alpha1.RebuildStatus{
			Time: metav1.NewTime(s.now), Reason: truncate(why, 256),
			Available: rep.Available, Reserved: rep.Reserved, Sold: rep.Sold, RestoredOrders: rep.Restored,
			DurationSeconds: fmt.Sprintf("%.3f", rep.Duration.Seconds()),
		}
		if why == "" {
			s.fs.Status.LastRebuild.Reason = "resumed after the sale failed closed"
		}
		// The phase above is what the rebuilt shards say, until observe
		// recomputes it: a later phase that stops early must not leave it blank.
		s.event(corev1.EventTypeNormal, ReasonRebuilt, "Rebuilt the stock from the ledger in %s: epoch %d, available %d, reserved %d, sold %d; %d pending orders restored",
			rep.Duration.Round(time.Millisecond), rep.Epoch, rep.Available, rep.Reserved, rep.Sold, rep.Restored)
	}
	return r.afterSeed(ctx, s, ids, srv)
}

// afterSeed records the Redis servers that hold the verified shards, stamps
// shards seeded before metas recorded their server, and reports Redis health.
func (r *FlashSaleReconciler) afterSeed(ctx context.Context, s *scope, ids map[string]string, srv stock.ServerCheck) (bool, error) {
	eng := s.conn.engine
	s.conn.rememberRunIDs(ids)
	s.fs.Status.RedisServers = redisServers(ids)
	// Shards seeded before metas recorded their server get it now, verified.
	if _, err := eng.Store().Stamp(ctx); err != nil {
		r.unhealthy(s, err)
		return true, nil
	}
	// A server that may evict keys is reported, and the sale goes on being
	// gated and observed: only seeding and rebuilding are refused on it.
	if err := srv.Evicting; err != nil {
		if c := meta.FindStatusCondition(s.fs.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy); c == nil || c.Reason != ReasonEvictionPolicy {
			s.statusEvent(corev1.EventTypeWarning, ReasonRedisEvictionPolicy, "%s", err.Error())
		}
		s.condition(flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse, ReasonEvictionPolicy, err.Error())
		s.setNotReady(ReasonRedisEvictionPolicy, err.Error())
	} else {
		s.condition(flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionTrue, ReasonReachable, fmt.Sprintf("every shard carries epoch %d", s.epoch))
	}
	s.condition(flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue, ReasonSeeded, fmt.Sprintf("ledger campaign and %d shards hold the sale (epoch %d)", resolve(s.fs).shards, s.epoch))
	return false, nil
}
