package controllers

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// The status rules, one table: what computeStatus makes of the status read
// and the facts the phases recorded.

var statusNow = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

const statusGen = 4

// healthy are the facts of a reconcile that went through every phase of an
// open sale with ready pods.
func healthy() facts {
	return facts{
		ledgerOK: true, seeded: true, epoch: 2,
		servers:    []flashsalev1alpha1.RedisServerStatus{{Address: "127.0.0.1:6379", RunID: "r1"}},
		allocation: &allocationVerdict{applied: true, reason: ReasonApplied, message: "allocation 100 is in effect"},
		counts: &engine.Counts{Allocation: 100, Epoch: 2, Available: 60, Reserved: 10, Sold: 30,
			Shards: []engine.ShardCounts{{Index: 0, Present: true, Available: 60, Allocation: 100, Sold: 30}}},
		countsAt: statusNow, gate: stock.StateOpen,
		children:    &readiness{ready: true, reason: ReasonReady},
		completed:   true,
		reservePods: ptr.To[int32](3),
		clocks:      &clockVerdict{inStep: true, message: "PostgreSQL's clock and the Redis servers' agree within 1s"},
		replication: &replicationVerdict{safe: true, reason: ReasonNoStandby, message: "PostgreSQL streams its WAL to no standby"},
	}
}

// stopped are the facts of a reconcile that stopped before observe.
func stopped(mod func(*facts)) facts {
	f := facts{}
	mod(&f)
	return f
}

// readStatus is a status as the previous reconcile left it: a live, healthy sale.
func readStatus() flashsalev1alpha1.FlashSaleStatus {
	old := metav1.NewTime(statusNow.Add(-time.Hour))
	c := func(typ, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, LastTransitionTime: old, ObservedGeneration: statusGen - 1}
	}
	return flashsalev1alpha1.FlashSaleStatus{
		Phase: flashsalev1alpha1.PhaseOpen, ObservedGeneration: statusGen - 1, Epoch: 2,
		Allocation: 100, Available: 60, Reserved: 10, Sold: 30,
		Shards:           []flashsalev1alpha1.ShardStatus{{Index: 0, Available: 60, Reserved: 10}},
		CountsObservedAt: &metav1.Time{Time: statusNow.Add(-10 * time.Second)},
		Conditions: []metav1.Condition{
			c(flashsalev1alpha1.ConditionLedgerHealthy, ReasonReachable), c(flashsalev1alpha1.ConditionRedisHealthy, ReasonReachable),
			c(flashsalev1alpha1.ConditionSeeded, ReasonSeeded), c(ConditionAllocationApplied, ReasonApplied),
			c(flashsalev1alpha1.ConditionAdmitting, ReasonOpen), c(flashsalev1alpha1.ConditionReady, ReasonReady),
			c(flashsalev1alpha1.ConditionLedgerFailoverSafe, ReasonNoStandby),
			c(flashsalev1alpha1.ConditionClocksInStep, ReasonInStep), // last: a case below changes it
		},
		ReservationReplicas: 2,
	}
}

type want map[string]string // condition type → "Status/Reason"; "-" for absent

func TestComputeStatus(t *testing.T) {
	ledgerDown := &ledgerError{errors.New("connection refused")}
	redisDown := errors.New("dial tcp 127.0.0.1:6379: connection refused")
	for _, tc := range []struct {
		name  string
		read  func(*flashsalev1alpha1.FlashSaleStatus) // the status read, from readStatus
		facts facts
		phase flashsalev1alpha1.FlashSalePhase
		conds want
		// observed: observedGeneration moves to the spec's generation.
		observed bool
		check    func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus)
	}{
		{name: "first reconcile of a healthy sale", read: func(st *flashsalev1alpha1.FlashSaleStatus) { *st = flashsalev1alpha1.FlashSaleStatus{} },
			facts: healthy(), phase: flashsalev1alpha1.PhaseOpen, observed: true,
			conds: want{"Ready": "True/Ready", "Admitting": "True/Open", "RedisHealthy": "True/Reachable", "LedgerHealthy": "True/Reachable",
				"Seeded": "True/Seeded", ConditionAllocationApplied: "True/Applied"},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if st.Available != 60 || st.Reserved != 10 || st.Sold != 30 || st.Epoch != 2 || len(st.Shards) != 1 || st.Shards[0].Reserved != 10 {
					t.Errorf("counts: %+v", st)
				}
				if st.CountsObservedAt == nil || !st.CountsObservedAt.Time.Equal(statusNow) {
					t.Errorf("countsObservedAt: %v", st.CountsObservedAt)
				}
				if len(st.RedisServers) != 1 || st.ReservationReplicas != 3 || st.ReservationSelector == "" {
					t.Errorf("servers, scale: %+v", st)
				}
				if c := meta.FindStatusCondition(st.Conditions, "RedisHealthy"); !strings.Contains(c.Message, "epoch 2") {
					t.Errorf("RedisHealthy: %+v", c)
				}
			}},
		{name: "unchanged sale keeps its transition times and count stamp", facts: healthy(), phase: flashsalev1alpha1.PhaseOpen, observed: true,
			conds: want{"Ready": "True/Ready"},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				for _, c := range st.Conditions {
					if !c.LastTransitionTime.Time.Equal(statusNow.Add(-time.Hour)) || c.ObservedGeneration != statusGen {
						t.Errorf("%s: %v, generation %d", c.Type, c.LastTransitionTime, c.ObservedGeneration)
					}
				}
				if !st.CountsObservedAt.Time.Equal(statusNow.Add(-10 * time.Second)) {
					t.Errorf("counts unchanged within the stamp were re-stamped: %v", st.CountsObservedAt)
				}
			}},
		{name: "unchanged counts older than the stamp are re-stamped",
			read: func(st *flashsalev1alpha1.FlashSaleStatus) {
				st.CountsObservedAt = &metav1.Time{Time: statusNow.Add(-2 * time.Minute)}
			},
			facts: healthy(), phase: flashsalev1alpha1.PhaseOpen, observed: true, conds: want{},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if !st.CountsObservedAt.Time.Equal(statusNow) {
					t.Errorf("countsObservedAt: %v", st.CountsObservedAt)
				}
			}},
		{name: "sold out", facts: with(healthy(), func(f *facts) { f.counts.Available, f.counts.Shards[0].Available = 0, 0 }),
			phase: flashsalev1alpha1.PhaseSoldOut, observed: true, conds: want{"Admitting": "True/SoldOut", "Ready": "True/Ready"}},
		{name: "paused", facts: with(healthy(), func(f *facts) { f.gate = stock.StatePaused }),
			phase: flashsalev1alpha1.PhasePaused, observed: true, conds: want{"Admitting": "False/Paused"}},
		{name: "not started", facts: with(healthy(), func(f *facts) { f.gate = stock.StateNotStarted }),
			phase: flashsalev1alpha1.PhaseScheduled, observed: true, conds: want{"Admitting": "False/NotStarted"}},
		{name: "ended with pending orders in the ledger", facts: with(healthy(), func(f *facts) { f.gate, f.counts.Reserved, f.counts.Pending = stock.StateEnded, 0, 3 }),
			phase: flashsalev1alpha1.PhaseEnded, observed: true, conds: want{"Admitting": "False/Ended"}},
		{name: "ended with nothing held", facts: with(healthy(), func(f *facts) { f.gate, f.counts.Reserved = stock.StateEnded, 0 }),
			phase: flashsalev1alpha1.PhaseCompleted, observed: true},
		{name: "no reserve pod ready", facts: with(healthy(), func(f *facts) {
			f.children = &readiness{reason: ReasonChildrenNotReady, message: "Deployment x-reserve has 0 of 2 replicas ready: buyers reach no reservation API"}
		}), phase: flashsalev1alpha1.PhaseOpen, observed: true,
			conds: want{"Admitting": "False/" + ReasonChildrenNotReady, "Ready": "False/" + ReasonChildrenNotReady},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if c := meta.FindStatusCondition(st.Conditions, "Admitting"); !strings.Contains(c.Message, "0 of 2 replicas ready") {
					t.Errorf("Admitting: %+v, want the Deployment's replicas", c)
				}
			}},
		{name: "no reserve pod ready while paused", facts: with(healthy(), func(f *facts) {
			f.gate = stock.StatePaused
			f.children = &readiness{reason: ReasonChildrenNotReady, message: "spec.reservation.replicas is 0: no reserve pod serves buyers"}
		}), phase: flashsalev1alpha1.PhasePaused, observed: true, conds: want{"Admitting": "False/Paused"}},
		{name: "children not ready", facts: with(healthy(), func(f *facts) {
			f.children = &readiness{reason: ReasonSweeperNotReady, message: "Deployment x-sweeper has 0 of 1 replicas ready"}
		}), phase: flashsalev1alpha1.PhaseOpen, observed: true, conds: want{"Ready": "False/SweeperNotReady", "Admitting": "True/Open"}},
		{name: "clocks apart: reported beside a Ready sale", facts: with(healthy(), func(f *facts) {
			f.clocks = &clockVerdict{message: "PostgreSQL's clock is 5s ahead"}
		}), phase: flashsalev1alpha1.PhaseOpen, observed: true, conds: want{"Ready": "True/Ready", "ClocksInStep": "False/ClockSkew"}},
		{name: "clocks not read: ClocksInStep keeps what it said", facts: with(healthy(), func(f *facts) { f.clocks = nil }),
			read: func(st *flashsalev1alpha1.FlashSaleStatus) {
				st.Conditions[len(st.Conditions)-1].Status = metav1.ConditionFalse
			},
			phase: flashsalev1alpha1.PhaseOpen, observed: true, conds: want{"ClocksInStep": "False/InStep"}},
		{name: "an asynchronous standby: reported beside a Ready sale", facts: with(healthy(), func(f *facts) {
			f.replication = &replicationVerdict{reason: ReasonAsynchronousStandby, message: "PostgreSQL streams asynchronously (synchronous_standby_names is empty) to 1 standby (pg-b)"}
		}), phase: flashsalev1alpha1.PhaseOpen, observed: true, conds: want{"Ready": "True/Ready", "LedgerFailoverSafe": "False/AsynchronousStandby"}},
		{name: "replication not read: LedgerFailoverSafe keeps what it said", facts: with(healthy(), func(f *facts) { f.replication = nil }),
			read: func(st *flashsalev1alpha1.FlashSaleStatus) {
				meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: flashsalev1alpha1.ConditionLedgerFailoverSafe,
					Status: metav1.ConditionFalse, Reason: ReasonAsynchronousStandby, Message: "PostgreSQL streams asynchronously (synchronous_standby_names is empty) to 1 standby (pg-b)"})
			},
			phase: flashsalev1alpha1.PhaseOpen, observed: true, conds: want{"LedgerFailoverSafe": "False/AsynchronousStandby"}},
		{name: "a Secret missing, no connections", facts: stopped(func(f *facts) {
			f.refErr = &referenceError{reason: ReasonSecretNotFound, message: `Secret "shop-redis" not found`}
		}), phase: flashsalev1alpha1.PhaseOpen,
			conds: want{"Ready": "False/SecretNotFound", "Admitting": "Unknown/SecretNotFound", "RedisHealthy": "Unknown/SecretNotFound",
				"LedgerHealthy": "Unknown/SecretNotFound", "ClocksInStep": "Unknown/SecretNotFound", "LedgerFailoverSafe": "Unknown/SecretNotFound",
				"Seeded": "True/Seeded"}},
		{name: "a Secret missing on a new sale adds no condition it did not check",
			read: func(st *flashsalev1alpha1.FlashSaleStatus) { *st = flashsalev1alpha1.FlashSaleStatus{} },
			facts: stopped(func(f *facts) {
				f.refErr = &referenceError{reason: ReasonSecretKeyMissing, message: `Secret "shop-ledger" has no key "dsn"`}
			}),
			conds: want{"Ready": "False/SecretKeyMissing", "Admitting": "-", "RedisHealthy": "-", "LedgerHealthy": "-"}},
		{name: "a Secret gone during the sale, served by the connections before", facts: with(healthy(), func(f *facts) {
			f.refErr, f.refsKept = &referenceError{reason: ReasonSecretNotFound, message: `Secret "shop-redis" not found`}, true
		}), phase: flashsalev1alpha1.PhaseOpen, conds: want{"Ready": "False/SecretNotFound", "Admitting": "True/Open", "RedisHealthy": "True/Reachable"},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if c := meta.FindStatusCondition(st.Conditions, "Ready"); !strings.Contains(c.Message, "still served") {
					t.Errorf("Ready: %+v", c)
				}
			}},
		{name: "new connections do not open, the old ones serve", facts: with(healthy(), func(f *facts) {
			f.replaced = &failure{readyReason: ReasonLedgerUnreachable, message: "new connections ... do not open"}
		}), phase: flashsalev1alpha1.PhaseOpen, conds: want{"Ready": "False/LedgerUnreachable", "LedgerHealthy": "True/Reachable"}},
		{name: "Redis down after the ledger answered", facts: stopped(func(f *facts) { f.ledgerOK, f.outage = true, redisDown }),
			phase: flashsalev1alpha1.PhaseOpen,
			conds: want{"RedisHealthy": "False/Unreachable", "LedgerHealthy": "True/Reachable", "Ready": "False/RedisUnreachable", "Admitting": "False/Unhealthy",
				"Seeded": "True/Seeded"}},
		{name: "ledger down leaves Redis's health as it was", facts: stopped(func(f *facts) { f.outage = ledgerDown }),
			phase: flashsalev1alpha1.PhaseOpen,
			conds: want{"LedgerHealthy": "False/Unreachable", "RedisHealthy": "True/Reachable", "Ready": "False/LedgerUnreachable", "Admitting": "False/Unhealthy"}},
		{name: "ledger down, the sale closed through Redis by the pause switch", facts: stopped(func(f *facts) { f.outage, f.closed = ledgerDown, stock.StatePaused }),
			phase: flashsalev1alpha1.PhasePaused, conds: want{"LedgerHealthy": "False/Unreachable"}},
		{name: "ledger down at the schedule's end of a completed sale",
			read:  func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseCompleted },
			facts: stopped(func(f *facts) { f.outage, f.closed = ledgerDown, stock.StateEnded }), phase: flashsalev1alpha1.PhaseCompleted},
		// A status that lies does not decide the phase: the shards do.
		{name: "a FailClosed read while every shard holds ENDED is Ended",
			read:  func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseFailClosed },
			facts: stopped(func(f *facts) { f.outage, f.closed, f.held = ledgerDown, stock.StateEnded, 2 }), phase: flashsalev1alpha1.PhaseEnded},
		{name: "a Rebuilding read while every shard holds PAUSED is Paused",
			read:  func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseRebuilding },
			facts: stopped(func(f *facts) { f.outage, f.closed = ledgerDown, stock.StatePaused }), phase: flashsalev1alpha1.PhasePaused},
		{name: "a Completed read is refuted by reservations Redis holds",
			read:  func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseCompleted },
			facts: stopped(func(f *facts) { f.outage, f.closed, f.held = ledgerDown, stock.StateEnded, 3 }), phase: flashsalev1alpha1.PhaseEnded},
		{name: "failed closed by this reconcile, whatever gate the shards held before",
			read:  func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseCompleted },
			facts: stopped(func(f *facts) { f.lost, f.closed, f.outage = "shard 0 has no meta", stock.StateEnded, ledgerDown }), phase: flashsalev1alpha1.PhaseFailClosed},
		{name: "the rebuild failed on Redis after the shards were found ENDED",
			facts: stopped(func(f *facts) { f.closed, f.rebuildErr = stock.StateEnded, redisDown }), phase: flashsalev1alpha1.PhaseRebuilding},
		{name: "ledger holds another sale's data", facts: stopped(func(f *facts) {
			f.ledgerOK, f.mismatch = true, errors.New("the ledger's campaign has 4 shards, the sale 2")
		}), phase: flashsalev1alpha1.PhaseOpen,
			conds: want{"LedgerHealthy": "False/Mismatch", "Ready": "False/LedgerMismatch", "Admitting": "False/Unhealthy"}},
		{name: "Redis lost the sale's state", facts: stopped(func(f *facts) { f.ledgerOK, f.lost = true, "shard 0 has no meta" }),
			phase: flashsalev1alpha1.PhaseFailClosed,
			conds: want{"RedisHealthy": "False/RedisDataLost", "Admitting": "False/FailClosed", "Ready": "False/FailClosed", "LedgerHealthy": "True/Reachable"},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if c := meta.FindStatusCondition(st.Conditions, "Ready"); !strings.Contains(c.Message, "shard 0 has no meta") {
					t.Errorf("Ready: %+v", c)
				}
			}},
		{name: "failed closed, then the ledger did not take the record", facts: stopped(func(f *facts) {
			f.lost, f.outage = "shard 0 has no meta", ledgerDown
		}), phase: flashsalev1alpha1.PhaseFailClosed,
			conds: want{"LedgerHealthy": "False/Unreachable", "Ready": "False/LedgerUnreachable", "RedisHealthy": "False/RedisDataLost"}},
		{name: "the rebuild failed on Redis", read: func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseFailClosed },
			facts: stopped(func(f *facts) { f.rebuildErr = redisDown }), phase: flashsalev1alpha1.PhaseRebuilding,
			conds: want{"Ready": "False/RebuildFailed", "Admitting": "False/FailClosed", "LedgerHealthy": "True/Reachable"}},
		{name: "the rebuild failed on the ledger", read: func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseFailClosed },
			facts: stopped(func(f *facts) { f.rebuildErr = ledgerDown }), phase: flashsalev1alpha1.PhaseFailClosed,
			conds: want{"Ready": "False/RebuildFailed", "Admitting": "False/FailClosed", "LedgerHealthy": "False/Unreachable"}},
		{name: "a rebuild that ran failed on the ledger", read: func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseRebuilding },
			facts: stopped(func(f *facts) { f.rebuildErr = ledgerDown }), phase: flashsalev1alpha1.PhaseFailClosed,
			conds: want{"Ready": "False/RebuildFailed", "LedgerHealthy": "False/Unreachable"}},
		// The ledger answered, but its counters disagree with its orders:
		// not an outage, and a retry will not fix it.
		{name: "the rebuild found the ledger's counters apart", read: func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseRebuilding },
			facts: stopped(func(f *facts) {
				f.rebuildErr = classify(fmt.Errorf("%w: rebuild read: %w", engine.ErrLedger,
					fmt.Errorf("%w: shard 0 counts 3 pending units, its orders hold 2", engine.ErrCountsDrift)))
			}), phase: flashsalev1alpha1.PhaseFailClosed,
			conds: want{"Ready": "False/RebuildFailed", "Admitting": "False/FailClosed", "LedgerHealthy": "False/CountsDrift"},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				c := meta.FindStatusCondition(st.Conditions, "LedgerHealthy")
				if !strings.Contains(c.Message, "counters disagree") || strings.Contains(c.Message, "unreachable") {
					t.Errorf("LedgerHealthy: %+v", c)
				}
			}},
		{name: "rebuilt, then the ledger went down", read: func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseFailClosed },
			facts: stopped(func(f *facts) {
				f.rebuilt = &engine.RebuildReport{Epoch: 3, Available: 5, Gate: stock.StateOpen}
				f.lastRebuild = &flashsalev1alpha1.RebuildStatus{Reason: "shard 0 has no meta", Available: 5}
				f.seeded, f.epoch, f.outage = true, 3, ledgerDown
			}), phase: flashsalev1alpha1.PhaseOpen,
			conds: want{"RedisHealthy": "True/Reachable", "LedgerHealthy": "False/Unreachable", "Ready": "False/LedgerUnreachable"},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if st.LastRebuild == nil || st.LastRebuild.Reason != "shard 0 has no meta" {
					t.Errorf("lastRebuild: %+v", st.LastRebuild)
				}
			}},
		{name: "a Redis that may evict is reported, and the sale goes on", facts: with(healthy(), func(f *facts) {
			f.evicting = errors.New("127.0.0.1:6379 has maxmemory-policy allkeys-lru")
		}), phase: flashsalev1alpha1.PhaseOpen, observed: true,
			conds: want{"RedisHealthy": "False/EvictionPolicy", "Ready": "False/RedisEvictionPolicy", "Seeded": "True/Seeded", "Admitting": "True/Open"}},
		{name: "allocation refused", facts: with(healthy(), func(f *facts) {
			f.allocation = &allocationVerdict{reason: ReasonAllocationRefused, message: "allocation 10 refused"}
		}), phase: flashsalev1alpha1.PhaseOpen,
			conds: want{ConditionAllocationApplied: "False/" + ReasonAllocationRefused, "Ready": "False/" + ReasonAllocationRefused}},
		{name: "allocation being lowered", facts: with(healthy(), func(f *facts) {
			f.allocation = &allocationVerdict{reason: ReasonAllocationPending, message: "lowering"}
		}), phase: flashsalev1alpha1.PhaseOpen,
			conds: want{ConditionAllocationApplied: "False/" + ReasonAllocationPending, "Ready": "False/" + ReasonAllocationPending}},
		// Not in effect yet: Ready must not tell a pipeline waiting on it
		// (kubectl wait) that the new generation is.
		{name: "allocation retried after a rebuild meanwhile", facts: with(healthy(), func(f *facts) {
			f.allocation = &allocationVerdict{reason: ReasonAllocationRetried, message: "retried"}
		}), phase: flashsalev1alpha1.PhaseOpen,
			conds: want{ConditionAllocationApplied: "False/" + ReasonAllocationRetried, "Ready": "False/" + ReasonAllocationRetried}},
		{name: "allocation retried after an earlier change landed meanwhile", facts: with(healthy(), func(f *facts) {
			f.allocation = &allocationVerdict{reason: ReasonAllocationChanged, message: "retried"}
		}), phase: flashsalev1alpha1.PhaseOpen,
			conds: want{ConditionAllocationApplied: "False/" + ReasonAllocationChanged, "Ready": "False/" + ReasonAllocationChanged}},
		{name: "a child that cannot be written has the last word on Ready", facts: with(healthy(), func(f *facts) {
			f.allocation = &allocationVerdict{reason: ReasonAllocationRefused, message: "allocation 10 refused"}
			f.evicting = errors.New("evicts")
			f.childErr = "cannot write Deployment x-reserve: it exists and is not owned by FlashSale x"
		}), phase: flashsalev1alpha1.PhaseOpen,
			conds: want{"Ready": "False/ChildrenFailed", ConditionAllocationApplied: "False/" + ReasonAllocationRefused, "RedisHealthy": "False/EvictionPolicy"}},
		{name: "Redis down outranks a Secret gone for Ready: nothing is served", facts: stopped(func(f *facts) {
			f.refErr, f.refsKept, f.outage = &referenceError{reason: ReasonSecretNotFound, message: "gone"}, true, redisDown
		}), phase: flashsalev1alpha1.PhaseOpen, conds: want{"Ready": "False/RedisUnreachable", "RedisHealthy": "False/Unreachable", "Admitting": "False/Unhealthy"}},
		{name: "the ledger down outranks an allocation refused for Ready", facts: stopped(func(f *facts) {
			f.allocation, f.outage = &allocationVerdict{reason: ReasonAllocationRefused, message: "allocation 10 refused"}, ledgerDown
		}), phase: flashsalev1alpha1.PhaseOpen, conds: want{"Ready": "False/LedgerUnreachable", ConditionAllocationApplied: "False/" + ReasonAllocationRefused}},
		{name: "a rebuild running says Redis lost the sale's state, whatever the status read",
			read:  func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseOpen },
			facts: stopped(func(f *facts) { f.ledgerOK, f.rebuilding = true, true }), phase: flashsalev1alpha1.PhaseRebuilding,
			conds: want{"Ready": "False/Rebuilding", "RedisHealthy": "False/RedisDataLost"}},
		{name: "a rebuild completing a first seeding cut short is no loss",
			read:  func(st *flashsalev1alpha1.FlashSaleStatus) { *st = flashsalev1alpha1.FlashSaleStatus{} },
			facts: stopped(func(f *facts) { f.ledgerOK, f.rebuilding, f.firstSeeding = true, true, true }), phase: flashsalev1alpha1.PhaseRebuilding,
			conds: want{"Ready": "False/Rebuilding", "RedisHealthy": "-"}},
		{name: "a verdict decided twice keeps the transition time it was read with",
			read: func(st *flashsalev1alpha1.FlashSaleStatus) {
				for i := range st.Conditions {
					switch st.Conditions[i].Type {
					case "Ready":
						st.Conditions[i].Status, st.Conditions[i].Reason = metav1.ConditionFalse, ReasonSecretNotFound
					case "LedgerHealthy":
						st.Conditions[i].Status, st.Conditions[i].Reason = metav1.ConditionFalse, ReasonUnreachable
					}
				}
			},
			// The ledger answered, then failed; the pods are ready, and a Secret is gone.
			facts: with(healthy(), func(f *facts) {
				f.refErr, f.refsKept = &referenceError{reason: ReasonSecretNotFound, message: "gone"}, true
			}), phase: flashsalev1alpha1.PhaseOpen, conds: want{"Ready": "False/SecretNotFound"},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if c := meta.FindStatusCondition(st.Conditions, "Ready"); !c.LastTransitionTime.Time.Equal(statusNow.Add(-time.Hour)) {
					t.Errorf("Ready moved: %+v", c)
				}
			}},
		{name: "a ledger that answered, then failed, has not recovered in between",
			read: func(st *flashsalev1alpha1.FlashSaleStatus) {
				i := slices.IndexFunc(st.Conditions, func(c metav1.Condition) bool { return c.Type == "LedgerHealthy" })
				st.Conditions[i].Status, st.Conditions[i].Reason = metav1.ConditionFalse, ReasonUnreachable
			},
			facts: stopped(func(f *facts) { f.ledgerOK, f.outage = true, ledgerDown }), phase: flashsalev1alpha1.PhaseOpen,
			conds: want{"LedgerHealthy": "False/Unreachable"},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if c := meta.FindStatusCondition(st.Conditions, "LedgerHealthy"); !c.LastTransitionTime.Time.Equal(statusNow.Add(-time.Hour)) {
					t.Errorf("LedgerHealthy moved: %+v", c)
				}
			}},
		{name: "a reconcile that failed is not observed", facts: with(healthy(), func(f *facts) { f.err = errors.New("the API server went away") }),
			phase: flashsalev1alpha1.PhaseOpen, conds: want{"Ready": "True/Ready"}},
		{name: "a rebuild running reports how far it got", read: func(st *flashsalev1alpha1.FlashSaleStatus) { st.Phase = flashsalev1alpha1.PhaseFailClosed },
			facts: stopped(func(f *facts) {
				f.ledgerOK, f.rebuilding = true, true
				f.progress = &engine.RebuildProgress{Started: statusNow.Add(-1500 * time.Millisecond), Epoch: 3, Shards: 4, Finished: 2}
			}), phase: flashsalev1alpha1.PhaseRebuilding,
			conds: want{"Ready": "False/Rebuilding", "Admitting": "False/FailClosed", "LedgerHealthy": "True/Reachable"},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				p := st.RebuildProgress
				if p == nil || p.Shards != 4 || p.ShardsDone != 2 || p.Epoch != 3 || p.StartedAt == nil || !p.StartedAt.Time.Equal(statusNow.Add(-2*time.Second)) {
					t.Errorf("rebuildProgress: %+v", p)
				}
				if c := meta.FindStatusCondition(st.Conditions, "Ready"); !strings.Contains(c.Message, "2 of 4 shards done") {
					t.Errorf("Ready: %+v", c)
				}
			}},
		{name: "a rebuild running whose progress was not read keeps the progress read",
			read: func(st *flashsalev1alpha1.FlashSaleStatus) {
				st.Phase, st.RebuildProgress = flashsalev1alpha1.PhaseRebuilding, &flashsalev1alpha1.RebuildProgress{Epoch: 3, Shards: 4, ShardsDone: 1}
			},
			facts: stopped(func(f *facts) { f.rebuilding = true }), phase: flashsalev1alpha1.PhaseRebuilding,
			conds: want{"Ready": "False/Rebuilding"},
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if p := st.RebuildProgress; p == nil || p.ShardsDone != 1 {
					t.Errorf("rebuildProgress: %+v", p)
				}
			}},
		{name: "no rebuild running any more: its progress is gone",
			read: func(st *flashsalev1alpha1.FlashSaleStatus) {
				st.RebuildProgress = &flashsalev1alpha1.RebuildProgress{Epoch: 2, Shards: 1, ShardsDone: 1}
			},
			facts: with(healthy(), func(f *facts) { f.rebuildChecked = true }), phase: flashsalev1alpha1.PhaseOpen, observed: true,
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if st.RebuildProgress != nil {
					t.Errorf("rebuildProgress: %+v", st.RebuildProgress)
				}
			}},
		{name: "a reconcile stopped before it looked for a rebuild keeps the progress read",
			read: func(st *flashsalev1alpha1.FlashSaleStatus) {
				st.Phase, st.RebuildProgress = flashsalev1alpha1.PhaseRebuilding, &flashsalev1alpha1.RebuildProgress{Epoch: 3, Shards: 4, ShardsDone: 1}
			},
			facts: stopped(func(f *facts) { f.outage = redisDown }), phase: flashsalev1alpha1.PhaseRebuilding,
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if p := st.RebuildProgress; p == nil || p.ShardsDone != 1 {
					t.Errorf("rebuildProgress: %+v", p)
				}
			}},
		{name: "the children's readiness not read keeps Ready and the phase from the counts",
			facts: with(healthy(), func(f *facts) { f.children, f.completed, f.err = nil, false, errors.New("cache read") }),
			phase: flashsalev1alpha1.PhaseOpen, conds: want{"Ready": "True/Ready"}},
		{name: "the reserve Deployment not read keeps its replicas", facts: with(healthy(), func(f *facts) { f.reservePods = nil }),
			phase: flashsalev1alpha1.PhaseOpen, observed: true,
			check: func(t *testing.T, st *flashsalev1alpha1.FlashSaleStatus) {
				if st.ReservationReplicas != 2 {
					t.Errorf("replicas: %d", st.ReservationReplicas)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := &flashsalev1alpha1.FlashSale{ObjectMeta: metav1.ObjectMeta{Name: "drop", Namespace: "shop", Generation: statusGen}}
			fs.Spec.Shards = ptr.To[int32](1)
			fs.Status = readStatus()
			if tc.read != nil {
				tc.read(&fs.Status)
			}
			read := fs.Status.DeepCopy()
			st := computeStatus(fs, &tc.facts, DefaultCountsStamp)
			if st.Phase != tc.phase {
				t.Errorf("phase %q, want %q", st.Phase, tc.phase)
			}
			for typ, w := range tc.conds {
				c := meta.FindStatusCondition(st.Conditions, typ)
				switch {
				case w == "-" && c != nil:
					t.Errorf("%s: %+v, want none", typ, c)
				case w != "-" && (c == nil || string(c.Status)+"/"+c.Reason != w):
					t.Errorf("%s: %+v, want %s", typ, c, w)
				}
			}
			if got := st.ObservedGeneration == statusGen; got != tc.observed {
				t.Errorf("observedGeneration %d (read %d), observed %v, want %v", st.ObservedGeneration, read.ObservedGeneration, got, tc.observed)
			}
			if tc.check != nil {
				tc.check(t, &st)
			}
			if !equality.Semantic.DeepEqual(*read, fs.Status) {
				t.Errorf("computeStatus changed the status it read")
			}
		})
	}
}

func with(f facts, mod func(*facts)) facts {
	mod(&f)
	return f
}
