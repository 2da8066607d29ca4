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
//
// It is given the reconcile's context without the phase bound, for the
// rebuild (it streams every pending order and buyer); everything else is
// bounded by PhaseTimeout.
func (r *FlashSaleReconciler) ensureStock(unbounded context.Context, s *scope) (bool, error) {
	ctx, cancel := context.WithTimeout(unbounded, r.phaseTimeout())
	defer cancel()
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
		s.mismatch = err
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
		s.lost = why
		msg := lostMessage(why)
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
		rep, err := eng.Rebuild(unbounded, func() string { return saleWindow(&s.fs.Spec, r.now()).Gate })
		if err != nil {
			s.rebuildErr = classify(err)
			s.event(corev1.EventTypeWarning, ReasonRebuildFailed, "%s", rebuildFailedMessage(s.rebuildErr))
			s.requeueAfter(retryUnhealthy)
			return true, nil
		}
		// The rest of the phase gets a bound of its own: the rebuild may
		// have outlasted the phase's.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(unbounded, r.phaseTimeout())
		defer cancel()
		s.epoch = rep.Epoch
		s.conn.rebuiltEpoch = rep.Epoch
		s.rebuilt = &rep
		if firstSeed && rep.Reserved == 0 && rep.Sold == 0 {
			s.event(corev1.EventTypeNormal, ReasonSeeded, "Seeded %d units into %d Redis shards (epoch %d), completing a first seeding that was cut short (%s)",
				s.fs.Spec.Allocation, resolve(s.fs).shards, rep.Epoch, why)
			return r.afterSeed(ctx, s, ids, srv)
		}
		if firstSeed {
			s.event(corev1.EventTypeWarning, ReasonRedisDataLost, "Redis lost the sale's state (%s) before the operator recorded it as seeded; rebuilt from the ledger", why)
		}
		s.lastRebuild = &flashsalev1alpha1.RebuildStatus{
			Time: metav1.NewTime(s.now), Reason: truncate(why, 256),
			Available: rep.Available, Reserved: rep.Reserved, Sold: rep.Sold, RestoredOrders: rep.Restored,
			DurationSeconds: fmt.Sprintf("%.3f", rep.Duration.Seconds()),
		}
		if why == "" {
			s.lastRebuild.Reason = "resumed after the sale failed closed"
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
	s.servers = redisServers(ids)
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
		s.evicting = err
	}
	s.seeded = true
	return false, nil
}
