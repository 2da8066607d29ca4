package controllers

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// computeStatus is the one place the status is decided: the phase, every
// condition, the counts and the records, from the status read (fs.Status)
// and the facts the phases recorded. A condition no fact speaks of keeps
// what it said.
func computeStatus(fs *flashsalev1alpha1.FlashSale, f *facts, countsStamp time.Duration) flashsalev1alpha1.FlashSaleStatus {
	st := *fs.Status.DeepCopy()
	d := &decided{generation: fs.Generation}

	// The records of what was seeded and rebuilt.
	if f.servers != nil {
		st.RedisServers = f.servers
	}
	if f.lastRebuild != nil {
		st.LastRebuild = f.lastRebuild
	}
	reportHealth(d, fs, f)

	// The phase: from the counts when observe read them, else from what
	// this reconcile did to the shards, else what it was.
	if f.rebuilt != nil {
		st.Phase = salePhase(f.rebuilt.Gate, f.rebuilt.Available, f.rebuilt.Reserved)
	}
	if f.counts != nil {
		reportCounts(&st, d, &fs.Spec, f, countsStamp)
	}
	if c := f.children; c != nil && c.ready {
		d.set(flashsalev1alpha1.ConditionReady, metav1.ConditionTrue, ReasonReady, "stock seeded, Redis and ledger healthy, reservation API and sweeper available")
	} else if c != nil {
		d.ready(c.reason, c.message)
	}
	if f.lost != "" {
		d.set(flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse, ReasonRedisDataLost, lostMessage(f.lost))
	}
	if !f.completed && f.closed != "" {
		// observe did not finish: the phase says what the shards hold (a
		// stop below may say more).
		st.Phase = closedPhase(f.closed, f.held, st.Phase)
	}
	stopped := reportStop(&st, d, fs, f)
	if f.rebuildChecked && !f.rebuilding {
		st.RebuildProgress = nil
	}
	if f.lost != "" {
		// The shards were failed closed, whatever stopped the reconcile next.
		st.Phase = flashsalev1alpha1.PhaseFailClosed
	}

	// A problem that did not stop the phases has the last word on Ready,
	// unless one did stop them: an outage, or a sale failed closed, is what
	// Ready's reason must name then.
	if reason, message, ok := f.notReady(); ok && !stopped {
		d.ready(reason, message)
	}
	// Only a reconcile that went through every phase has applied this spec.
	if f.err == nil && f.completed && !f.incomplete() {
		st.ObservedGeneration = fs.Generation
	}

	// The scale subresource's status, whatever phase the reconcile stopped
	// at: an autoscaler reads it while Redis or the ledger is down too.
	st.ReservationSelector = labels.SelectorFromSet(childLabels(fs, ComponentReserve)).String()
	if f.reservePods != nil {
		st.ReservationReplicas = *f.reservePods
	}
	// The replicas' crashes, whatever else held: a replica OOM-killed again
	// and again matters while Redis is down too, and Ready does not say it
	// while another replica serves.
	if f.replicas != nil {
		status, reason, message := degradedVerdict(findCrashes(f.replicas.pods, f.replicas.at))
		d.set(flashsalev1alpha1.ConditionDegraded, status, reason, message)
	}
	for _, c := range d.conditions {
		meta.SetStatusCondition(&st.Conditions, c)
	}
	return st
}

// decided holds the conditions computeStatus has decided, in order, a later
// rule overriding an earlier one; they are written once at the end, so a
// lastTransitionTime moves only when the final verdict differs from the one
// read.
type decided struct {
	generation int64
	conditions []metav1.Condition
}

func (d *decided) set(typ string, status metav1.ConditionStatus, reason, message string) {
	c := metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message, ObservedGeneration: d.generation}
	if i := slices.IndexFunc(d.conditions, func(c metav1.Condition) bool { return c.Type == typ }); i >= 0 {
		d.conditions[i] = c
		return
	}
	d.conditions = append(d.conditions, c)
}

func (d *decided) ready(reason, message string) {
	d.set(flashsalev1alpha1.ConditionReady, metav1.ConditionFalse, reason, message)
}

// reportHealth: Redis and the ledger as the phases found them, their
// clocks, the ledger's replication, and the allocation's verdict.
func reportHealth(d *decided, fs *flashsalev1alpha1.FlashSale, f *facts) {
	if f.ledgerOK {
		d.set(flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue, ReasonReachable, "PostgreSQL answers")
	}
	if f.seeded {
		if f.evicting != nil {
			d.set(flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse, ReasonEvictionPolicy, f.evicting.Error())
		} else {
			d.set(flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionTrue, ReasonReachable, fmt.Sprintf("every shard carries epoch %d", f.epoch))
		}
		d.set(flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue, ReasonSeeded,
			fmt.Sprintf("ledger campaign and %d shards hold the sale (epoch %d)", resolve(fs).shards, f.epoch))
	}
	if v := f.clocks; v != nil && v.inStep {
		d.set(flashsalev1alpha1.ConditionClocksInStep, metav1.ConditionTrue, ReasonInStep, v.message)
	} else if v != nil {
		d.set(flashsalev1alpha1.ConditionClocksInStep, metav1.ConditionFalse, ReasonClockSkew, v.message)
	}
	if v := f.replication; v != nil {
		status := metav1.ConditionFalse
		if v.safe {
			status = metav1.ConditionTrue
		}
		d.set(flashsalev1alpha1.ConditionLedgerFailoverSafe, status, v.reason, v.message)
	}
	if v := f.allocation; v != nil {
		status := metav1.ConditionFalse
		if v.applied {
			status = metav1.ConditionTrue
		}
		d.set(ConditionAllocationApplied, status, v.reason, v.message)
	}
}

// reportCounts: the counts observe read, the phase they imply and whether
// reservations are admitted.
func reportCounts(st *flashsalev1alpha1.FlashSaleStatus, d *decided, spec *flashsalev1alpha1.FlashSaleSpec, f *facts, countsStamp time.Duration) {
	c := f.counts
	shards := make([]flashsalev1alpha1.ShardStatus, 0, len(c.Shards))
	for _, sh := range c.Shards {
		shards = append(shards, flashsalev1alpha1.ShardStatus{Index: int32(sh.Index), Available: sh.Available, Reserved: sh.Unsold()})
	}
	// Available from Redis, sold from the ledger, reserved the rest (see
	// engine.ShardCounts.Unsold): they never add up to more than the allocation.
	reserved := c.Unsold()
	changed := st.Allocation != c.Allocation || st.Available != c.Available || st.Reserved != reserved ||
		st.Sold != c.Sold || !equality.Semantic.DeepEqual(st.Shards, shards)
	st.Epoch, st.Allocation = c.Epoch, c.Allocation
	st.Available, st.Reserved, st.Sold = c.Available, reserved, c.Sold
	st.Shards = shards
	// Renewed with the counts, and at least every CountsStamp: counts older
	// than that were not read (the reads above failed, or nobody ran them).
	if changed || st.CountsObservedAt == nil || f.countsAt.Sub(st.CountsObservedAt.Time) >= countsStamp {
		st.CountsObservedAt = &metav1.Time{Time: f.countsAt}
	}
	// Pending rows in the ledger count too: Completed means nothing can change any more.
	st.Phase = salePhase(f.gate, c.Available, max(c.Reserved, c.Pending))
	switch {
	case f.gate == engine.StateOpen && f.children != nil && f.children.reason == ReasonChildrenNotReady:
		// The shards admit, but no reserve pod serves: buyers are not taken.
		d.set(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonChildrenNotReady,
			"the sale is open, but buyers reach no reserve pod: "+f.children.message)
	case f.gate == engine.StateOpen && c.Available > 0:
		d.set(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionTrue, ReasonOpen, "reservations are admitted")
	case f.gate == engine.StateOpen:
		d.set(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionTrue, ReasonSoldOut, "admitting, but every unit is reserved or sold")
	default:
		d.set(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, gateReason(f.gate), gateMessage(f.gate, spec))
	}
}

// reportStop: what stopped the reconcile, if anything; at most one of these.
// It reports whether something did.
func reportStop(st *flashsalev1alpha1.FlashSaleStatus, d *decided, fs *flashsalev1alpha1.FlashSale, f *facts) bool {
	switch {
	case f.refErr != nil && !f.refsKept:
		d.ready(f.refErr.reason, f.refErr.message)
		// Nothing else was checked (an operator restarted while a Secret is
		// gone): what these said before is not known to hold any more.
		for _, typ := range []string{flashsalev1alpha1.ConditionAdmitting, flashsalev1alpha1.ConditionRedisHealthy, flashsalev1alpha1.ConditionLedgerHealthy,
			flashsalev1alpha1.ConditionClocksInStep, flashsalev1alpha1.ConditionLedgerFailoverSafe} {
			if meta.FindStatusCondition(st.Conditions, typ) != nil {
				d.set(typ, metav1.ConditionUnknown, f.refErr.reason, "not checked: "+f.refErr.message)
			}
		}
	case f.outage != nil:
		why := describeFailure(fs, f.outage)
		d.set(why.condition, metav1.ConditionFalse, why.reason, why.message)
		d.ready(why.readyReason, why.message)
		d.set(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonUnhealthy, "reservations cannot be taken: "+f.outage.Error())
	case f.mismatch != nil:
		msg := f.mismatch.Error()
		d.set(flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse, ReasonMismatch, msg)
		d.ready(ReasonLedgerMismatch, msg)
		d.set(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonUnhealthy, "reservations cannot be recorded: "+msg)
	case f.rebuilding:
		st.Phase = flashsalev1alpha1.PhaseRebuilding
		if f.progress != nil {
			st.RebuildProgress = progressStatus(f.progress)
		}
		msg := "the stock is being rebuilt from the ledger; every shard refuses reservations until it is whole"
		if p := st.RebuildProgress; p != nil {
			msg = fmt.Sprintf("the stock is being rebuilt from the ledger: %d of %d shards done; every shard refuses reservations until all are", p.ShardsDone, p.Shards)
		}
		d.ready(ReasonRebuilding, msg)
		d.set(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonFailClosed, msg)
		// Said from the rebuild, not only by the reconcile that found the
		// loss: its status may not have been written (a conflict, a
		// restart), and RedisHealthy would say True all through.
		if c := meta.FindStatusCondition(st.Conditions, flashsalev1alpha1.ConditionRedisHealthy); !f.firstSeeding &&
			(c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonRedisDataLost) {
			d.set(flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse, ReasonRedisDataLost,
				"Redis did not hold the sale's state; the shards are being rebuilt from the ledger")
		}
	case f.lost != "":
		msg := lostMessage(f.lost)
		d.set(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonFailClosed, msg)
		d.ready(ReasonFailClosed, msg)
	case f.rebuildErr != nil:
		msg := rebuildFailedMessage(f.rebuildErr)
		d.ready(ReasonRebuildFailed, msg)
		d.set(flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse, ReasonFailClosed, msg)
		switch {
		case errors.Is(f.rebuildErr, engine.ErrCountsDrift):
			// Not an outage: the retries fail until someone recounts the ledger.
			st.Phase = flashsalev1alpha1.PhaseFailClosed
			d.set(flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse, ReasonCountsDrift, f.rebuildErr.Error())
		case isLedgerError(f.rebuildErr):
			// Whatever the phase read was (Rebuilding, once a rebuild ran).
			st.Phase = flashsalev1alpha1.PhaseFailClosed
			d.set(flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse, ReasonUnreachable, f.rebuildErr.Error())
		default:
			st.Phase = flashsalev1alpha1.PhaseRebuilding
		}
	default:
		return false
	}
	return true
}

// notReady is what Ready says when a problem did not stop the phases (the
// last phase's to find one): a child that cannot be written, an allocation
// refused, still being lowered or to be tried again, a Redis that may evict, a Secret gone or
// changed to values that do not connect while the old connections serve.
func (f *facts) notReady() (reason, message string, ok bool) {
	switch {
	case f.childErr != "":
		return ReasonChildrenFailed, f.childErr, true
	case f.allocation != nil && !f.allocation.applied:
		return f.allocation.reason, f.allocation.message, true
	case f.seeded && f.evicting != nil:
		return ReasonRedisEvictionPolicy, f.evicting.Error(), true
	case f.refErr != nil && f.refsKept:
		return f.refErr.reason, f.refErr.message + " (the sale is still served and gated with the connections opened before)", true
	case f.replaced != nil:
		return f.replaced.readyReason, f.replaced.message, true
	}
	return "", "", false
}

// incomplete: part of the spec is not in effect although the phases went
// on; observedGeneration stays where it was.
func (f *facts) incomplete() bool {
	return f.refsKept || f.replaced != nil || f.childErr != "" || (f.allocation != nil && !f.allocation.applied)
}

// progressStatus is the status form of a running rebuild's progress.
func progressStatus(p *engine.RebuildProgress) *flashsalev1alpha1.RebuildProgress {
	out := &flashsalev1alpha1.RebuildProgress{Epoch: p.Epoch, Shards: int32(p.Shards), ShardsDone: int32(p.Finished)}
	if !p.Started.IsZero() {
		// Whole seconds, as lastRebuild's time.
		out.StartedAt = &metav1.Time{Time: p.Started.Truncate(time.Second)}
	}
	return out
}

func lostMessage(why string) string {
	return "Redis lost the sale's state (" + why + "); every shard refuses reservations until the stock is rebuilt from the ledger"
}

func rebuildFailedMessage(err error) string {
	return "rebuild from the ledger failed, the sale stays closed: " + err.Error()
}
