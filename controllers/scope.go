package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// scope is what the phases of one reconcile share.
type scope struct {
	fs     *flashsalev1alpha1.FlashSale
	now    time.Time
	window window
	conn   *campaignConn
	epoch  int64
	counts engine.Counts
	events []event // emitted after the status write succeeded
	result ctrl.Result
	// notReady, when set, is what Ready says at the end of the reconcile,
	// whatever the later phases found: a problem that does not stop them (a
	// Secret gone while the sale's connections still work, a child that cannot
	// be written).
	notReady *metav1.Condition
	// incomplete: a phase could not apply part of the spec although the
	// reconcile went on; observedGeneration stays where it was.
	incomplete bool
	// refs are the referenced Secrets' values when they could all be read.
	refs *references
	// ledgerDown: a phase stopped because the ledger failed.
	ledgerDown bool
	// closed is the closing gate every shard holds, when this reconcile
	// wrote it ahead of the ledger phases (closeFirst).
	closed string
	// unbounded is the reconcile's context without the phase bound, for
	// the rebuild.
	unbounded context.Context
}

func (s *scope) setNotReady(reason, message string) {
	s.notReady = &metav1.Condition{Reason: reason, Message: message}
}

type event struct {
	kind, reason, message string
	// fromStatus: decided by comparing with the status the reconcile read
	// (a phase change, a condition that starts failing), not by something
	// it did. Such an event is not sent when that status turns out stale.
	fromStatus bool
}

// event records what the reconcile did, sent once the status is written.
func (s *scope) event(kind, reason, format string, args ...any) {
	s.events = append(s.events, event{kind: kind, reason: reason, message: fmt.Sprintf(format, args...)})
}

// statusEvent records a change found against the status the reconcile read.
func (s *scope) statusEvent(kind, reason, format string, args ...any) {
	s.events = append(s.events, event{kind: kind, reason: reason, message: fmt.Sprintf(format, args...), fromStatus: true})
}

func (s *scope) condition(typ string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&s.fs.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: message, ObservedGeneration: s.fs.Generation,
	})
}

// requeueAfter keeps the earliest requested requeue.
func (s *scope) requeueAfter(d time.Duration) {
	if d > 0 && (s.result.RequeueAfter == 0 || d < s.result.RequeueAfter) {
		s.result.RequeueAfter = d
	}
}
