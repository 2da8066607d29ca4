package controllers

import (
	"time"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// ConditionAllocationApplied is True when spec.allocation is in effect.
const ConditionAllocationApplied = "AllocationApplied"

// Condition and event reasons.
const (
	ReasonSecretNotFound   = "SecretNotFound"
	ReasonSecretKeyMissing = "SecretKeyMissing"
	// ReasonInvalid: a Secret's value cannot be used (a DSN that does not parse).
	ReasonInvalid             = "Invalid"
	ReasonLedgerSecretInvalid = "LedgerSecretInvalid"
	// ReasonRedisSecretInvalid: the Redis Secret's addresses or TLS keys
	// cannot be used (a CA bundle without a certificate, a key without its
	// certificate, a "tls" value other than true or false).
	ReasonRedisSecretInvalid = "RedisSecretInvalid"
	ReasonReachable          = "Reachable"
	ReasonUnreachable        = "Unreachable"
	ReasonLedgerUnreachable  = "LedgerUnreachable"
	// ReasonMigrating: the ledger's schema is being upgraded (LedgerHealthy);
	// ReasonLedgerMigrating is Ready's reason for the same.
	ReasonMigrating        = "Migrating"
	ReasonLedgerMigrating  = "LedgerMigrating"
	ReasonRedisUnreachable = "RedisUnreachable"
	// Events: Redis or the ledger healthy again after a failure.
	ReasonRedisRecovered   = "RedisRecovered"
	ReasonLedgerRecovered  = "LedgerRecovered"
	ReasonUnsupported      = "Unsupported"
	ReasonRedisUnsupported = "RedisUnsupported"
	// ReasonRedisEvictionPolicy: a server holding shards may evict keys.
	ReasonRedisEvictionPolicy = "RedisEvictionPolicy"
	// ReasonEvictionPolicy is RedisHealthy's reason for the same.
	ReasonEvictionPolicy  = "EvictionPolicy"
	ReasonForbidden       = "Forbidden"
	ReasonRedisForbidden  = "RedisForbidden"
	ReasonLedgerForbidden = "LedgerForbidden"
	// ReasonOperatorConflict: another install manages the sale (an event of
	// the install that leaves it alone); ReasonOperatorChanged: this install
	// took a sale over from one whose Lease went stale (owner.go).
	ReasonOperatorConflict = "OperatorConflict"
	ReasonOperatorChanged  = "OperatorChanged"
	// ReasonReadOnly: the ledger answers but takes no writes (LedgerHealthy);
	// ReasonLedgerReadOnly is Ready's reason and the event's for the same.
	ReasonReadOnly          = "ReadOnly"
	ReasonLedgerReadOnly    = "LedgerReadOnly"
	ReasonMismatch          = "Mismatch"
	ReasonLedgerMismatch    = "LedgerMismatch"
	ReasonUnhealthy         = "Unhealthy"
	ReasonSeeded            = "Seeded"
	ReasonRedisDataLost     = "RedisDataLost"
	ReasonFailClosed        = "FailClosed"
	ReasonRebuilt           = "Rebuilt"
	ReasonRebuildFailed     = "RebuildFailed"
	ReasonRebuilding        = "Rebuilding"
	ReasonRestocked         = "Restocked"
	ReasonApplied           = "Applied"
	ReasonAllocationRefused = "AllocationBelowSoldAndReserved"
	ReasonAllocationPending = "AllocationDecreasePending"
	ReasonAllocationLowered = "AllocationLowered"
	ReasonAllocationRetried = "RebuiltMeanwhile"
	ReasonAllocationChanged = "AllocationChangedMeanwhile"
	ReasonGateChanged       = "GateChanged"
	// Warnings when a schedule moved past now (start later, end earlier)
	// closed an open sale.
	ReasonStartMovedLater  = "StartMovedLater"
	ReasonEndMovedEarlier  = "EndMovedEarlier"
	ReasonOpen             = "Open"
	ReasonSoldOut          = "SoldOut"
	ReasonNotStarted       = "NotStarted"
	ReasonPaused           = "Paused"
	ReasonEnded            = "Ended"
	ReasonReady            = "Ready"
	ReasonChildrenNotReady = "ReservationAPINotReady"
	ReasonSweeperNotReady  = "SweeperNotReady"
	ReasonRollingOut       = "RollingOut"
	ReasonChildrenFailed   = "ChildrenFailed"
	ReasonPhaseChanged     = "PhaseChanged"
	ReasonCleanupSkipped   = "CleanupSkipped"
	ReasonCleanupFailed    = "CleanupFailed"
	// ReasonDeleting: Ready while a deletion waits for its cleanup.
	ReasonDeleting = "Deleting"

	// A Warning when something else (an autoscaler pointed at a
	// Deployment instead of the FlashSale) set a Deployment's replicas,
	// which the operator then put back from the spec.
	ReasonReplicasOverridden = "ReplicasOverridden"

	// ClocksInStep's reasons, and the events of its changes: InStep, or
	// ClockSkew (a Warning too), and ClockSkewCleared when in step again.
	ReasonInStep           = "InStep"
	ReasonClockSkew        = "ClockSkew"
	ReasonClockSkewCleared = "ClockSkewCleared"

	// LedgerFailoverSafe's reasons, and the events of its changes:
	// NoStandby or SynchronousStandby; AsynchronousStandby or LocalCommit
	// (Warnings too), and FailoverSafe when safe again.
	ReasonNoStandby           = "NoStandby"
	ReasonSynchronousStandby  = "SynchronousStandby"
	ReasonAsynchronousStandby = "AsynchronousStandby"
	ReasonLocalCommit         = "LocalCommit"
	ReasonFailoverSafe        = "FailoverSafe"

	// Ready's reason when a reserve or sweeper Deployment's ReplicaFailure
	// condition is True: its pods are refused (a ResourceQuota, a
	// LimitRange, Pod Security admission).
	ReasonReplicaFailure = "ReplicaFailure"

	// Degraded's reasons (see findCrashes): a replica OOM-killed, one
	// waiting in CrashLoopBackOff after another end, one that exited
	// non-zero; none of these in crashWindow.
	ReasonOOMKilled        = "OOMKilled"
	ReasonCrashLoopBackOff = "CrashLoopBackOff"
	ReasonError            = "Error"
	ReasonReplicasStable   = "ReplicasStable"
	// Events: Degraded turned True, and False again.
	ReasonReplicaCrashing   = "ReplicaCrashing"
	ReasonReplicasRecovered = "ReplicasRecovered"

	// LedgerHealthy's reason when the ledger's per-shard counters disagree
	// with its orders (a rebuild refuses to compute stock from them), and
	// its event.
	ReasonCountsDrift       = "CountsDrift"
	ReasonLedgerCountsDrift = "LedgerCountsDrift"
)

func gateReason(gate string) string {
	switch gate {
	case engine.StateNotStarted:
		return ReasonNotStarted
	case engine.StatePaused:
		return ReasonPaused
	case engine.StateEnded:
		return ReasonEnded
	}
	return ReasonOpen
}

// gateMessage says why reservations are refused, with the schedule's edge
// the refusal lasts until (kubectl describe during the wait for a drop).
func gateMessage(gate string, spec *flashsalev1alpha1.FlashSaleSpec) string {
	start, end := scheduleOf(spec)
	at := func(t time.Time) string { // "" when the spec does not say (an end written on deletion)
		if t.IsZero() {
			return ""
		}
		return ", " + t.UTC().Format(time.RFC3339) + ","
	}
	switch gate {
	case engine.StateNotStarted:
		msg := "the schedule's start" + at(start) + " is ahead: reservations answer NOT_STARTED"
		if spec.Paused {
			// The phase says Scheduled until the start, then Paused.
			msg += "; spec.paused is set, so the sale stays closed (PAUSED) after the start until it is cleared"
		}
		return msg
	case engine.StatePaused:
		return "spec.paused is set: reservations answer PAUSED"
	case engine.StateEnded:
		return "the schedule's end" + at(end) + " has passed: reservations answer ENDED"
	}
	return "reservations are admitted"
}
