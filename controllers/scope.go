package controllers

import (
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// scope is what the phases of one reconcile share: the sale, the clock, the
// connections, and the facts they record for computeStatus. A phase never
// writes the status.
type scope struct {
	fs     *flashsalev1alpha1.FlashSale
	now    time.Time
	window window
	conn   *campaignConn
	// refs are the referenced Secrets' values when they could all be read.
	refs   *references
	events []event // emitted after the status write succeeded
	result ctrl.Result
	facts
}

// facts are what the phases of one reconcile saw and did. computeStatus
// derives the phase and every condition from them and the status read.
type facts struct {
	// refErr: a referenced Secret or key is missing. refsKept: the sale is
	// still served with the connections opened before it went.
	refErr   *referenceError
	refsKept bool
	// replaced: new connections (Secrets changed, or the spec) do not open,
	// and the sale runs on the ones opened before.
	replaced *failure
	// outage is the Redis or ledger failure that stopped the reconcile.
	outage error
	// ledgerOK: the ledger answered.
	ledgerOK bool
	// mismatch: the ledger does not hold what this sale sold.
	mismatch error
	// lost is why Redis is found to have lost the sale's state; the shards
	// were failed closed by this reconcile.
	lost string
	// rebuildErr: the rebuild from the ledger failed.
	rebuildErr error
	// rebuilding: a rebuild of the shards runs (off the reconcile);
	// progress is how far it got, as the ledger and the shards say (nil: not
	// known now). rebuildChecked: the reconcile looked for a running
	// rebuild, so none running is known too. firstSeeding: the rebuild
	// completes a first seeding cut short, not a loss.
	rebuilding     bool
	firstSeeding   bool
	progress       *engine.RebuildProgress
	rebuildChecked bool
	// rebuilt is the rebuild this reconcile performed; lastRebuild its
	// record (none when it completed a first seeding cut short).
	rebuilt     *engine.RebuildReport
	lastRebuild *flashsalev1alpha1.RebuildStatus
	// seeded: the ledger campaign and every shard hold the sale at epoch
	// (known once seeded or rebuilt);
	// servers are the Redis servers holding the verified shards; evicting
	// says they may evict keys.
	seeded   bool
	epoch    int64
	servers  []flashsalev1alpha1.RedisServerStatus
	evicting error
	// allocation is the verdict on spec.allocation, when it was applied.
	allocation *allocationVerdict
	// childErr: a child could not be written (the last one's message).
	childErr string
	// counts, read at countsAt while the schedule's gate was gate, when
	// observe got them.
	counts   *engine.Counts
	countsAt time.Time
	gate     string
	// children is the readiness of the reserve and sweeper Deployments.
	children *readiness
	// written are the Deployments this reconcile wrote, as stored.
	written []*appsv1.Deployment
	// closed is the closing gate every shard is known to hold, when this
	// reconcile wrote it or found it (closeFirst, applyGates).
	closed string
	// held: the units in RESERVED reservations on the shards when closed
	// was found.
	held int64
	// completed: every phase ran; err is the reconcile's error.
	completed bool
	err       error
	// reservePods is the reserve Deployment's replicas, when it was read.
	reservePods *int32
	// replicas are the reserve and sweeper pods, when they were read.
	replicas *replicaPods
	// clocks is the verdict on the ledger's and Redis's clocks, when they
	// were read.
	clocks *clockVerdict
	// replication is the verdict on how the ledger's commits reach its
	// standbys, when it was read.
	replication *replicationVerdict
}

// allocationVerdict is what became of spec.allocation: applied, or not
// (reason ReasonAllocationRefused, ReasonAllocationPending,
// ReasonAllocationRetried or ReasonAllocationChanged) with a message saying
// why; Ready says the same until it is applied.
type allocationVerdict struct {
	applied         bool
	reason, message string
}

// readiness is whether the reserve and sweeper Deployments serve, and why not.
type readiness struct {
	ready           bool
	reason, message string
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

// requeueAfter keeps the earliest requested requeue.
func (s *scope) requeueAfter(d time.Duration) {
	if d > 0 && (s.result.RequeueAfter == 0 || d < s.result.RequeueAfter) {
		s.result.RequeueAfter = d
	}
}
