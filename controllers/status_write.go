package controllers

import (
	"context"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

// eventNoteLimit is the longest event message the API server takes (bytes):
// a longer one is refused and the event lost.
const eventNoteLimit = 1024

// writeStatus writes the status, only when it changed, as one write guarded
// by the resourceVersion read, then emits the events. A sale changed since it
// was read (a status written since, a spec or metadata edit) is a conflict:
// the caller reconciles again, and the status is computed anew from Redis and
// the ledger rather than merged into the newer version.
func (r *FlashSaleReconciler) writeStatus(ctx context.Context, before *flashsalev1alpha1.FlashSale, s *scope) error {
	if s.fs.Status.Phase != before.Status.Phase && s.fs.Status.Phase != "" {
		s.statusEvent(corev1.EventTypeNormal, ReasonPhaseChanged, "Phase %s → %s", orNone(before.Status.Phase), s.fs.Status.Phase)
	}
	s.healthEvents(before.Status.Conditions)
	s.replicaEvents(before.Status.Conditions)
	if !equality.Semantic.DeepEqual(before.Status, s.fs.Status) {
		var err error
		if before.Status.ObservedGeneration == 0 && before.Status.Phase == "" {
			// The first write stores every count, zeros included (a merge patch
			// would leave out fields equal to the empty status), so the printer
			// columns show 0 rather than nothing.
			err = r.Status().Update(ctx, s.fs)
		} else {
			err = r.Status().Patch(ctx, s.fs, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		}
		if err != nil {
			// What this reconcile did is still said: none of it is done
			// again. What it found against the status it read, which may
			// be older than the stored one, comes from the next reconcile.
			r.emit(ctx, s, false)
			return err
		}
	}
	r.emit(ctx, s, true)
	return nil
}

// recordEvent sends an event and logs it: events expire after an hour, and
// the log is the timeline of an incident after that.
func (r *FlashSaleReconciler) recordEvent(ctx context.Context, regarding, related runtime.Object, kind, reason, action, msg string) {
	r.Recorder.Eventf(regarding, related, kind, reason, action, "%s", truncate(msg, eventNoteLimit))
	log.FromContext(ctx).Info(msg, "event", kind, "reason", reason)
}

// emit sends the reconcile's events, those found against the status it
// read only when withStatus. Logged too: events expire after an hour, and
// the log is the timeline of an incident after that.
func (r *FlashSaleReconciler) emit(ctx context.Context, s *scope, withStatus bool) {
	for _, e := range s.events {
		if e.fromStatus && !withStatus {
			continue
		}
		r.recordEvent(ctx, s.fs, nil, e.kind, e.reason, e.reason, e.message)
	}
}

// healthEvents says when Redis or the ledger stops answering, or refuses the
// operator, or their clocks part, or the ledger's commits stop waiting for
// its standbys, and when it is healthy again: the conditions alone leave no
// trace of an outage once it is over. Data loss and a ledger mismatch have
// events of their own.
func (s *scope) healthEvents(before []metav1.Condition) {
	for _, h := range []struct {
		typ, recovered string
		failures       map[string]string // condition reason → event reason
	}{
		{flashsalev1alpha1.ConditionRedisHealthy, ReasonRedisRecovered, map[string]string{
			ReasonUnreachable: ReasonRedisUnreachable, ReasonForbidden: ReasonRedisForbidden, ReasonUnsupported: ReasonRedisUnsupported,
			ReasonEvictionPolicy: ReasonRedisEvictionPolicy}},
		{flashsalev1alpha1.ConditionLedgerHealthy, ReasonLedgerRecovered, map[string]string{
			ReasonUnreachable: ReasonLedgerUnreachable, ReasonMigrating: ReasonLedgerMigrating, ReasonForbidden: ReasonLedgerForbidden, ReasonInvalid: ReasonLedgerSecretInvalid,
			ReasonReadOnly:    ReasonLedgerReadOnly,
			ReasonCountsDrift: ReasonLedgerCountsDrift}},
		{flashsalev1alpha1.ConditionClocksInStep, ReasonClockSkewCleared, map[string]string{ReasonClockSkew: ReasonClockSkew}},
		{flashsalev1alpha1.ConditionLedgerFailoverSafe, ReasonFailoverSafe, map[string]string{
			ReasonAsynchronousStandby: ReasonAsynchronousStandby, ReasonLocalCommit: ReasonLocalCommit}},
	} {
		was := meta.FindStatusCondition(before, h.typ)
		now := meta.FindStatusCondition(s.fs.Status.Conditions, h.typ)
		switch {
		case now == nil || (was != nil && was.Status == now.Status && was.Reason == now.Reason):
		case now.Status == metav1.ConditionFalse && h.failures[now.Reason] != "":
			s.statusEvent(corev1.EventTypeWarning, h.failures[now.Reason], "%s", now.Message)
		case now.Status == metav1.ConditionTrue && was != nil && was.Status == metav1.ConditionFalse:
			s.statusEvent(corev1.EventTypeNormal, h.recovered, "%s again: %s", h.typ, now.Message)
		}
	}
}

// replicaEvents says when a replica starts crashing (Degraded turns True)
// and when every replica is stable again: one Warning per episode, however
// often the replica restarts within it.
func (s *scope) replicaEvents(before []metav1.Condition) {
	was := meta.FindStatusCondition(before, flashsalev1alpha1.ConditionDegraded)
	now := meta.FindStatusCondition(s.fs.Status.Conditions, flashsalev1alpha1.ConditionDegraded)
	switch {
	case now == nil || (was != nil && was.Status == now.Status):
	case now.Status == metav1.ConditionTrue:
		s.statusEvent(corev1.EventTypeWarning, ReasonReplicaCrashing, "%s: %s", now.Reason, now.Message)
	case was != nil && was.Status == metav1.ConditionTrue:
		s.statusEvent(corev1.EventTypeNormal, ReasonReplicasRecovered, "%s", now.Message)
	}
}

func orNone(p flashsalev1alpha1.FlashSalePhase) string {
	if p == "" {
		return "(none)"
	}
	return string(p)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = "…"
	cut := n - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}
