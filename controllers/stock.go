package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// ensureStock seeds a new sale once, and detects and repairs Redis data loss: shards
// without meta, a stale epoch, or a Redis server that restarted. Loss first shows
// as FailClosed (every shard refuses), then the next reconcile rebuilds from the
// ledger.
//
// It is given the reconcile's context without the phase bound, for the
// rebuild, which runs off the reconcile (it streams every pending order and
// buyer); everything else is bounded by PhaseTimeout.
func (r *FlashSaleReconciler) ensureStock(unbounded context.Context, s *scope) (bool, error) {
	ctx, cancel := context.WithTimeout(unbounded, r.phaseTimeout())
	defer cancel()
	eng := s.conn.engine
	if r.rebuildRunning(ctx, s) {
		return true, nil
	}
	lost, why, failedClosed := false, "", false
	res, err := eng.SeedSale(ctx, s.window.Gate, r.setUpBefore(s))
	switch {
	case errors.Is(err, engine.ErrFailedClosed):
		// Closed on a loss that is already known: its rebuild is due (below),
		// though the ledger may have missed the record of it.
		failedClosed = true
	case errors.Is(err, engine.ErrNeedsRebuild):
		lost, why = true, err.Error()
	case errors.Is(err, engine.ErrLedgerMismatch):
		// Neither seeded nor rebuilt: either would trust a ledger that does
		// not hold what was sold. Pods writing to it are fenced (no campaign).
		if c := meta.FindStatusCondition(s.fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c == nil || c.Reason != ReasonLedgerMismatch {
			s.statusEvent(corev1.EventTypeWarning, ReasonLedgerMismatch, "%s", err.Error())
		}
		s.mismatch = err
		s.requeueAfter(retryUnhealthy)
		return true, nil
	case errors.Is(err, errReadingChildren):
		return false, err // the API server's, not Redis's or the ledger's: retried with backoff
	case err != nil:
		if isLedgerError(classify(err)) {
			r.lostWhileLedgerDown(ctx, s, res.Missing, res.Shards, eng.Gates())
		}
		r.unhealthy(s, classify(err))
		return true, nil
	}
	s.epoch = res.Campaign.Epoch
	if res.Seeded > 0 {
		s.event(corev1.EventTypeNormal, ReasonSeeded, "Seeded %d units into %d Redis shards (epoch %d)", res.Campaign.Allocation, res.Seeded, res.Campaign.Epoch)
	}
	// What the ledger keeps for the operator (the servers verified before,
	// the last rebuild) decides, and the status reports it.
	rec, err := eng.Record(ctx)
	if err != nil {
		r.unhealthy(s, classify(err))
		return true, nil
	}
	s.lastRebuild = rebuildStatus(rec.LastRebuild)
	if len(rec.Servers) > 0 {
		s.servers = redisServers(rec.Servers)
	}
	srv, err := eng.Servers(ctx)
	if err != nil {
		r.unhealthy(s, err)
		return true, nil
	}
	ids := srv.RunIDs
	if res.Live && rebuiltUnrecorded(rec, res.Campaign.Epoch) {
		if !r.recordFinishedRebuild(ctx, s, &rec, ids) {
			return true, nil
		}
	}
	if !lost {
		why, lost = s.conn.runIDsChanged(redisServers(rec.Servers), ids)
	}
	// firstSeed: the sale was never recorded as seeded (its servers are
	// recorded once it is). Shards missing then are most likely a first
	// seeding cut short (an operator restart, a Redis refusal fixed since):
	// they are written from the ledger as a rebuild would, and reported as
	// data loss only if the ledger shows the sale had taken reservations.
	firstSeed := lost && rec.Servers == nil && rec.LastRebuild == nil
	// Redis and the ledger decide, never the status: a loss found now, or
	// shards failed closed before and not rebuilt since.
	due := rec.RebuildDue() || failedClosed
	needsRebuild := lost || due
	if needsRebuild && !firstSeed && !due {
		// Close every shard at once (shards without meta already refuse), say
		// so, record it, and rebuild on the next reconcile, right after this
		// status is written. On a context of its own: a slow ledger may have
		// spent the phase's.
		cctx, cancel := closingContext(ctx)
		_ = eng.FailClose(cctx)
		cancel()
		s.lost = why
		s.event(corev1.EventTypeWarning, ReasonRedisDataLost, "%s", lostMessage(why))
		if err := eng.RecordFailClosed(ctx, engine.FailClosedRecord{Time: s.now, Reason: truncate(why, 256), Epoch: res.Campaign.Epoch}); err != nil {
			// Found again, and recorded, once the ledger answers.
			r.unhealthy(s, classify(err))
			return true, nil
		}
		s.result.RequeueAfter = time.Millisecond
		return true, nil
	}
	if needsRebuild {
		if wait, err := s.conn.failed.wait(s.fs.Generation, s.now); err != nil {
			// The last try's verdict stands until the next.
			s.rebuildErr = err
			s.requeueAfter(wait)
			return true, nil
		}
		if run := s.conn.interrupted; run != nil {
			why, s.conn.interrupted = run.why, nil
		}
		r.reportRebuilding(ctx, s, r.startRebuild(unbounded, s, rebuildStart{why: why, firstSeed: firstSeed, servers: ids, spec: s.fs.Spec}))
		return true, nil
	}
	s.conn.failed = rebuildBackoff{} // healthy: a later failure starts over
	return r.afterSeed(ctx, s, rec.Servers, srv)
}

// rebuildRunning looks at this connection's rebuild, which runs off the
// reconcile: while it runs the status says how far it got; once over, what
// came of it is recorded and reported. It reports whether the phase is done.
func (r *FlashSaleReconciler) rebuildRunning(ctx context.Context, s *scope) bool {
	s.rebuildChecked = true
	run := s.conn.rebuild.Load()
	switch {
	case run == nil:
		return false
	case !run.over():
		r.reportRebuilding(ctx, s, run)
		return true
	}
	s.conn.rebuild.Store(nil)
	if run.interrupted() {
		// Stopped when its connections were replaced (a Secret rotated):
		// no failure to report or back off from. The shards it left are
		// rebuilt again, for the same loss.
		log.FromContext(ctx).Info("the rebuild was stopped by a change of connections; starting it again", "err", run.err.Error())
		s.conn.interrupted = run
		return false
	}
	return r.rebuildOver(ctx, s, run)
}

// rebuildOver records and reports a rebuild that ended: a failure is retried
// (the shards stay closed), a success is kept in the ledger with the servers
// it rebuilt on, and the phase goes on to check what it left.
// It reports whether the phase is done.
func (r *FlashSaleReconciler) rebuildOver(ctx context.Context, s *scope, run *rebuildRun) bool {
	rep, why := run.rep, run.why
	if run.err != nil {
		s.rebuildErr = classify(run.err)
		next := s.conn.failed.failedAgain(s.rebuildErr, s.fs.Generation, s.now)
		inARow := "" // counted for lasting failures only, which back off
		if n := s.conn.failed.n; n > 0 {
			inARow = fmt.Sprintf("failure %d in a row, ", n)
		}
		s.event(corev1.EventTypeWarning, ReasonRebuildFailed, "%s (after %s; %stried again in %s)",
			rebuildFailedMessage(s.rebuildErr), rep.Duration.Round(time.Millisecond), inARow, next)
		s.requeueAfter(next)
		return true
	}
	s.conn.failed = rebuildBackoff{}
	s.epoch = rep.Epoch
	s.rebuilt = &rep
	// The servers it wrote to hold the sale as the ledger does now: the
	// checks below must not take them for restarted.
	s.conn.rememberRunIDs(run.servers)
	if run.firstSeed && rep.Reserved == 0 && rep.Sold == 0 {
		s.event(corev1.EventTypeNormal, ReasonSeeded, "Seeded %d units into %d Redis shards (epoch %d), completing a first seeding that was cut short (%s)",
			s.fs.Spec.Allocation, resolve(s.fs).shards, rep.Epoch, why)
		return false
	}
	rb := engine.RebuildRecord{Time: s.now, Reason: truncate(why, 256), Epoch: rep.Epoch,
		Available: rep.Available, Reserved: rep.Reserved, Sold: rep.Sold, Restored: rep.Restored, Duration: rep.Duration}
	if why == "" {
		rb.Reason = "resumed after the sale failed closed"
	}
	// Kept in the ledger with the servers it rebuilt on: a later
	// reconcile, or another operator, must not take them for restarted
	// and rebuild again, whatever status it reads.
	if err := s.conn.engine.RecordRebuild(ctx, rb, run.servers); err != nil {
		// The run is kept until it is recorded: forgotten, the ledger would
		// still say the sale failed closed, and the next reconcile would
		// rebuild it again (closed meanwhile, a new epoch refusing the
		// reservations of this one), recording a reason that is not why.
		if !errors.Is(err, engine.ErrCampaignNotFound) { // another database: SeedSale says so
			s.conn.rebuild.CompareAndSwap(nil, run)
		}
		r.unhealthy(s, classify(err))
		return true
	}
	if run.firstSeed {
		s.event(corev1.EventTypeWarning, ReasonRedisDataLost, "Redis lost the sale's state (%s) before the operator recorded it as seeded; rebuilt from the ledger", why)
	}
	s.lastRebuild = rebuildStatus(&rb)
	s.event(corev1.EventTypeNormal, ReasonRebuilt, "Rebuilt the stock from the ledger in %s: epoch %d, available %d, reserved %d, sold %d; %d pending orders restored",
		rep.Duration.Round(time.Millisecond), rep.Epoch, rep.Available, rep.Reserved, rep.Sold, rep.Restored)
	return false
}

// lostWhileLedgerDown: shards without meta, read before the ledger failed
// to answer, are a loss of Redis's data the rebuild must wait for, if the
// sale ran: its children, written once it was first seeded, say so (a
// first seeding cut short looks the same). The shards are failed closed
// through Redis alone, and the status says so: it would read Open and
// RedisHealthy True until the ledger answered.
func (r *FlashSaleReconciler) lostWhileLedgerDown(ctx context.Context, s *scope, missing, shards int, gates *engine.Gates) {
	if missing == 0 {
		return
	}
	// Contexts of their own: a ledger that hangs may have spent the phase's.
	cctx, cancel := closingContext(ctx)
	defer cancel()
	if ran, rerr := r.setUpBefore(s)(cctx); rerr != nil || !ran {
		return
	}
	_ = gates.FailClose(cctx)
	s.lost = fmt.Sprintf("%d of %d shards have no meta; the ledger does not answer, and the rebuild waits for it", missing, shards)
	// Found again at every reconcile until the ledger answers: said once,
	// against the status read (sent only if this status is written).
	if c := meta.FindStatusCondition(s.fs.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy); c == nil || c.Message != lostMessage(s.lost) {
		s.statusEvent(corev1.EventTypeWarning, ReasonRedisDataLost, "%s", lostMessage(s.lost))
	}
}

// rebuiltUnrecorded: the rebuild that began at the ledger's epoch, after
// the last fail-close, finished, but its end was never recorded (its
// process died first, or the ledger refused the record and the process
// restarted since). Only a rebuild moves the epoch on, and it opens a shard
// only once the shard is whole: shards all live at that epoch, on the
// servers that wrote them (SeedResult.Live), are that rebuild's, finished.
func rebuiltUnrecorded(rec engine.Record, epoch int64) bool {
	return rec.RebuildDue() && rec.RebuildStarted != nil && rec.RebuildStarted.Epoch == epoch && epoch > rec.FailClosed.Epoch
}

// recordFinishedRebuild records a rebuild rebuiltUnrecorded found, with the
// servers that hold the shards now, into rec too. Run again instead, it
// would close the sale for as long as it runs and move the epoch on under
// the reservations taken since. It reports whether the phase goes on.
func (r *FlashSaleReconciler) recordFinishedRebuild(ctx context.Context, s *scope, rec *engine.Record, ids map[string]string) bool {
	c, err := s.conn.engine.Counts(ctx)
	if err != nil {
		r.unhealthy(s, classify(err))
		return false
	}
	rb := engine.RebuildRecord{Time: rec.RebuildStarted.Time, Reason: rec.FailClosed.Reason, Epoch: rec.RebuildStarted.Epoch,
		Available: c.Available, Reserved: c.Unsold(), Sold: c.Sold}
	if err := s.conn.engine.RecordRebuild(ctx, rb, ids); err != nil {
		r.unhealthy(s, classify(err))
		return false
	}
	rec.LastRebuild, rec.Servers = &rb, ids
	s.lastRebuild = rebuildStatus(&rb)
	s.event(corev1.EventTypeNormal, ReasonRebuilt, "Recorded the rebuild from the ledger that began at %s and finished before its end was recorded: epoch %d, available %d, reserved %d, sold %d now",
		rb.Time.UTC().Format(time.RFC3339), rb.Epoch, rb.Available, rb.Reserved, rb.Sold)
	return true
}

// rebuildStatus is the status form of the ledger's rebuild record (nil for none).
func rebuildStatus(rb *engine.RebuildRecord) *flashsalev1alpha1.RebuildStatus {
	if rb == nil {
		return nil
	}
	return &flashsalev1alpha1.RebuildStatus{
		// The status keeps whole seconds: a finer time would differ from the
		// stored one at every reconcile.
		Time: metav1.NewTime(rb.Time.Truncate(time.Second)), Reason: rb.Reason,
		Available: rb.Available, Reserved: rb.Reserved, Sold: rb.Sold, RestoredOrders: rb.Restored,
		DurationSeconds: fmt.Sprintf("%.3f", rb.Duration.Seconds()),
	}
}

// afterSeed records the Redis servers that hold the verified shards (in the
// ledger, where known says what it holds, and in the status), stamps shards
// seeded before metas recorded their server, and reports Redis health.
func (r *FlashSaleReconciler) afterSeed(ctx context.Context, s *scope, known map[string]string, srv engine.ServerCheck) (bool, error) {
	eng := s.conn.engine
	ids := srv.RunIDs
	s.conn.rememberRunIDs(ids)
	s.servers = redisServers(ids)
	if len(ids) > 0 && !maps.Equal(known, ids) {
		if err := eng.RecordServers(ctx, ids); err != nil {
			r.unhealthy(s, classify(err))
			return true, nil
		}
	}
	// Shards seeded before metas recorded their server get it now, verified.
	if _, err := eng.StampShards(ctx); err != nil {
		r.unhealthy(s, err)
		return true, nil
	}
	// A server that may evict keys is reported (RedisHealthy's change sends
	// the Warning), and the sale goes on being gated and observed: only
	// seeding and rebuilding are refused on it.
	if err := srv.Evicting; err != nil {
		s.evicting = err
	}
	s.seeded = true
	return false, nil
}

// errReadingChildren: setUpBefore could not read the sale's children.
var errReadingChildren = errors.New("cannot tell whether the sale ran")

// setUpBefore tells, when neither Redis nor the ledger holds the sale (a DSN
// switched to another database after Redis lost its data too), whether it
// ran: its reservation id Secret or its reserve Deployment exists. Both are
// written only after the first seed, and no unit can be sold without them:
// the reserve pods read the Secret. They are read past the cache: this is
// asked only then. The status is a report, not a record: a status lost or
// written wrong changes nothing here.
func (r *FlashSaleReconciler) setUpBefore(s *scope) engine.SetUpBefore {
	return func(ctx context.Context) (bool, error) {
		for _, obj := range []client.Object{
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.fs.Namespace, Name: ChildName(s.fs, ComponentIDs)}},
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: s.fs.Namespace, Name: ChildName(s.fs, ComponentReserve)}},
		} {
			err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
			switch {
			case apierrors.IsNotFound(err):
				continue
			case err != nil:
				return false, fmt.Errorf("%w: reading %s: %w", errReadingChildren, obj.GetName(), err)
			case metav1.IsControlledBy(obj, s.fs):
				return true, nil
			}
		}
		return false, nil
	}
}
