/*
Copyright 2026 The flashsale-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FlashSalePhase is the one-word summary of where a FlashSale is in its life.
// +kubebuilder:validation:Enum=Scheduled;Open;Paused;SoldOut;Ended;Completed;FailClosed;Rebuilding
type FlashSalePhase string

const (
	// PhaseScheduled: the sale has a schedule whose start is still ahead.
	PhaseScheduled FlashSalePhase = "Scheduled"
	// PhaseOpen: reservations are being admitted.
	PhaseOpen FlashSalePhase = "Open"
	// PhasePaused: spec.paused is set; no new reservations are admitted.
	PhasePaused FlashSalePhase = "Paused"
	// PhaseSoldOut: every unit is reserved or sold; open reservations may
	// still expire and return units to stock.
	PhaseSoldOut FlashSalePhase = "SoldOut"
	// PhaseEnded: the schedule's end has passed; open reservations may still
	// be checked out or released.
	PhaseEnded FlashSalePhase = "Ended"
	// PhaseCompleted: the sale is over and no reservation is open any more.
	PhaseCompleted FlashSalePhase = "Completed"
	// PhaseFailClosed: Redis lost or disagrees with the sale's state; every
	// shard refuses reservations until the stock is rebuilt from the ledger.
	PhaseFailClosed FlashSalePhase = "FailClosed"
	// PhaseRebuilding: the stock is being rebuilt from the ledger, and every
	// shard refuses reservations until it is whole. Either a rebuild runs
	// (status.rebuildProgress says how many shards it finished; Ready's
	// reason is Rebuilding), or the last one failed for a reason other than
	// the ledger and is retried (Ready's reason is RebuildFailed). A rebuild
	// that fails on the ledger leaves the sale FailClosed, LedgerHealthy
	// False. Once the rebuild is over the phase is the sale's again.
	PhaseRebuilding FlashSalePhase = "Rebuilding"
)

// Condition types reported in status.conditions.
const (
	// ConditionReady is True when the sale's children are running and its
	// state in Redis and PostgreSQL is consistent.
	ConditionReady = "Ready"
	// ConditionSeeded is True once the ledger row exists and the Redis shards
	// were seeded (it stays True after a loss: RedisHealthy says whether
	// Redis still holds them).
	ConditionSeeded = "Seeded"
	// ConditionAdmitting is True while the sale accepts new reservations.
	ConditionAdmitting = "Admitting"
	// ConditionRedisHealthy is True while every Redis shard answers and
	// carries the current epoch.
	ConditionRedisHealthy = "RedisHealthy"
	// ConditionLedgerHealthy is True while PostgreSQL answers.
	ConditionLedgerHealthy = "LedgerHealthy"
	// ConditionDegraded is True while a reserve or sweeper replica crashes,
	// whatever the other replicas do: one of its containers waits in
	// CrashLoopBackOff, or ended with an OOM kill or a non-zero exit less
	// than 10 minutes ago (the kubelet's own span: a container that runs
	// that long has its restart back-off reset). Its reason is OOMKilled,
	// CrashLoopBackOff or Error, in that order of precedence over the
	// replicas; its message names each replica's Deployment, pod, the
	// termination's reason and exit code, when it ended and the restart
	// count. It is False (ReplicasStable) once every replica has run 10
	// minutes without such an end, as the pods' container states tell (the
	// times the kubelet reports). A pod being deleted, or Failed or
	// Succeeded (evicted), does not count. Ready keeps its own meaning: a
	// sale whose other replicas serve stays Ready.
	ConditionDegraded = "Degraded"
	// ConditionClocksInStep is True while PostgreSQL's clock and the clock
	// of every Redis server holding the sale's shards agree within the
	// smaller of 1s and a tenth of reservation.ttl. A reservation's
	// expires_at is set by Redis's clock and judged by PostgreSQL's: a
	// database clock ahead by Δ leaves every buyer Δ less to pay, one behind
	// takes checkouts up to Δ late and gives expired units back Δ late. A
	// reading counts beyond its round trips' uncertainty, and gives no
	// verdict when they hide the answer. False (ClockSkew) names the server
	// and the difference, until it is under half the bound; the operator
	// reads the clocks with every status refresh. Ready keeps its own
	// meaning.
	ConditionClocksInStep = "ClocksInStep"
	// ConditionLedgerFailoverSafe is True while a failover of PostgreSQL to
	// a standby keeps every commit the sale answered for: the server streams
	// its WAL to no standby and keeps no idle physical replication slot of
	// one away (NoStandby), or a commit waits for the standbys
	// synchronous_standby_names names (SynchronousStandby). False
	// (AsynchronousStandby) names the standbys, and the slots of those
	// away, when that setting is empty,
	// or when the ledger's role may read sync_state (pg_monitor) and the
	// setting names none of them or lets a backup tool's WAL client stand
	// for one; False (LocalCommit) says synchronous_commit is local. A failover then loses the last reservations and payments, and
	// a rebuild sells their units again. Logical walsenders, the WAL clients
	// of backup tools and the replicas the sale's annotation
	// flashsale.dev/ledger-standbys-never-promoted names (application_names
	// or slot names) are no standbys. The operator reads it with
	// every status refresh; Ready keeps its own meaning.
	ConditionLedgerFailoverSafe = "LedgerFailoverSafe"
)

// FlashSaleStatus is the observed state of a flash-sale campaign. Everything
// an on-call engineer needs during an incident is here.
type FlashSaleStatus struct {
	// conditions are the latest observations of the sale's state: Ready,
	// Seeded, Admitting, RedisHealthy, LedgerHealthy, AllocationApplied,
	// Degraded, ClocksInStep and LedgerFailoverSafe. Degraded is True while a reserve or sweeper
	// replica crashes (a container waiting in CrashLoopBackOff, or ended by
	// an OOM kill or a non-zero exit in the last 10 minutes, as the pod's
	// container states say), reason OOMKilled, CrashLoopBackOff or Error,
	// its message naming the pod; Ready stays True meanwhile while another
	// replica serves. ClocksInStep is False (ClockSkew) while PostgreSQL's
	// clock and a Redis server's differ by more than the smaller of 1s and a
	// tenth of reservation.ttl: expiries are set by one and judged by the
	// other. LedgerFailoverSafe is False (AsynchronousStandby, LocalCommit)
	// while PostgreSQL streams to standbys without waiting for one at
	// commit: a failover to one loses acknowledged reservations and
	// payments.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// phase is the one-word summary of where the sale is.
	// +optional
	Phase FlashSalePhase `json:"phase,omitempty"`

	// epoch is the generation of the Redis state. It is bumped by every
	// rebuild from the ledger; reservations made under an older epoch are
	// refused by the ledger.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Epoch int64 `json:"epoch,omitempty"`

	// allocation is the allocation the counts below were taken against.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Allocation int64 `json:"allocation"`

	// available is the number of units still in stock, summed over shards.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Available int64 `json:"available"`

	// reserved is the number of units held by open reservations.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Reserved int64 `json:"reserved"`

	// sold is the number of units committed in the ledger.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Sold int64 `json:"sold"`

	// countsObservedAt is when available, reserved, sold and shards were
	// last read from Redis and the ledger: at least once a minute while the
	// operator can reach them (every 5 minutes once the sale is Completed),
	// so counts older than that are stale (Redis or the ledger unreachable,
	// the sale failed closed, the operator down).
	// +optional
	CountsObservedAt *metav1.Time `json:"countsObservedAt,omitempty"`

	// shards are the counts of each stock shard.
	// +optional
	// +listType=map
	// +listMapKey=index
	// +kubebuilder:validation:MaxItems=1024
	Shards []ShardStatus `json:"shards,omitempty"`

	// lastRebuild records the last time the stock was rebuilt from the
	// ledger.
	// +optional
	LastRebuild *RebuildStatus `json:"lastRebuild,omitempty"`

	// rebuildProgress is how far the rebuild of the stock from the ledger
	// got, while one runs (phase Rebuilding); it is gone once the rebuild
	// is over, and lastRebuild records it. Read from the ledger and the
	// shards at the last reconcile, at least every few seconds meanwhile.
	// +optional
	RebuildProgress *RebuildProgress `json:"rebuildProgress,omitempty"`

	// redisServers are the Redis servers holding the sale's shards, each with
	// the run id it had when the stock was last verified. A server found with
	// another run id restarted, and one not listed took shards over (a
	// failover): either may hold data older than the ledger, so the sale fails
	// closed and is rebuilt. A report: the operator keeps them in the
	// ledger's campaign row, so that a restarted one notices too.
	// +optional
	// +listType=map
	// +listMapKey=address
	// +kubebuilder:validation:MaxItems=1024
	RedisServers []RedisServerStatus `json:"redisServers,omitempty"`

	// reservationReplicas is the number of reservation API pods (the reserve
	// Deployment's status.replicas): the current count of the scale
	// subresource, which kubectl scale and a HorizontalPodAutoscaler use to
	// set spec.reservation.replicas.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ReservationReplicas int32 `json:"reservationReplicas,omitempty"`

	// reservationSelector selects the reservation API pods (a label
	// selector in its string form), for the scale subresource.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	ReservationSelector string `json:"reservationSelector,omitempty"`

	// observedGeneration is the metadata.generation the status was last
	// computed from.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// ShardStatus holds the counts of one stock shard.
type ShardStatus struct {
	// index is the shard's number, from 0 to shards-1.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1023
	Index int32 `json:"index"`

	// available is the number of units in the shard's stock.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Available int64 `json:"available"`

	// reserved is the number of units held by open reservations on the
	// shard.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Reserved int64 `json:"reserved"`
}

// RedisServerStatus is one Redis server that holds shards of the sale.
type RedisServerStatus struct {
	// address is the server's host:port.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Address string `json:"address,omitempty"`

	// runID is the server's run_id (INFO server); it changes on every restart.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	RunID string `json:"runID,omitempty"`
}

// RebuildStatus records a rebuild of the Redis stock from the ledger.
type RebuildStatus struct {
	// time is when the rebuild finished.
	// +required
	Time metav1.Time `json:"time"`

	// reason says why the stock was rebuilt, e.g. "redis lost campaign state:
	// rebuild from the ledger required: 2 of 10 shards missing ..." or
	// "resumed after the sale failed closed".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`

	// available is the number of units put back in stock.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Available int64 `json:"available"`

	// reserved is the number of units of still-valid reservations restored.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Reserved int64 `json:"reserved"`

	// sold is the number of committed units counted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Sold int64 `json:"sold"`

	// restoredOrders is the number of pending orders recreated as
	// reservations in Redis.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RestoredOrders int64 `json:"restoredOrders,omitempty"`

	// durationSeconds is how long the rebuild took, in decimal seconds
	// (e.g. "0.042").
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
	DurationSeconds string `json:"durationSeconds,omitempty"`
}

// RebuildProgress is how far a running rebuild of the stock got.
type RebuildProgress struct {
	// startedAt is when the rebuild started; unset until the ledger
	// recorded its start.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// epoch is the epoch the shards are rebuilt at; 0 until the ledger
	// bumped it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Epoch int64 `json:"epoch,omitempty"`

	// shards is the number of shards being rebuilt.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	Shards int32 `json:"shards,omitempty"`

	// shardsDone is the number of shards the rebuild has finished: their
	// stock and reservations written, still closed. They open together once
	// every shard is done.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	ShardsDone int32 `json:"shardsDone"`
}
