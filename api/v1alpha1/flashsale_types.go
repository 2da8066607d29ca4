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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RedisMode says how the Redis addresses in the Secret are to be used.
// +kubebuilder:validation:Enum=standalone;cluster
type RedisMode string

const (
	// RedisModeStandalone: one Redis server holds every shard.
	RedisModeStandalone RedisMode = "standalone"
	// RedisModeCluster: the addresses are seeds of a Redis Cluster; each
	// shard lives in the slot of its hash tag.
	RedisModeCluster RedisMode = "cluster"
)

// Defaults applied by the API server. The CRD markers below carry the same
// values; a unit test keeps the two in step.
const (
	DefaultShards              int32  = 10
	DefaultMaxPerUser          int32  = 1
	DefaultReservationTTL             = "10m"
	DefaultReservationGrace           = "30s"
	DefaultStealProbes         int32  = 2
	DefaultReservationReplicas int32  = 2
	DefaultRequestTimeout             = "5s"
	DefaultMaxInFlight         int32  = 16384
	DefaultSweeperInterval            = "30s"
	DefaultRedisMode                  = RedisModeStandalone
	DefaultPostgresSecretKey   string = "dsn"
	DefaultAdmissionSecretKey  string = "hmac-key"
)

// FlashSaleSpec is the desired state of a flash-sale campaign: one SKU, how
// many units are for sale, how the stock is split, when the sale runs, and
// where its Redis, ledger and admission key are.
type FlashSaleSpec struct {
	// sku identifies the item on sale. It cannot be changed: create a new
	// FlashSale to sell another item. No whitespace at either end: the pods
	// trim it, and would then disagree with the ledger.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^\S(.*\S)?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="sku is immutable: create a new FlashSale to sell another item"
	SKU string `json:"sku,omitempty"`

	// allocation is the number of units for sale, at most 10,000,000 (the
	// largest sale shown to rebuild after a Redis loss, docs/rebuild-benchmarks.md).
	// It may be raised to restock; the controller refuses to lower it below
	// sold + reserved.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self <= 10000000",message="allocation is at most 10000000: a larger sale is not shown to rebuild from the ledger in minutes after a Redis loss (docs/rebuild-benchmarks.md)"
	Allocation int64 `json:"allocation"`

	// shards is the number of Redis stock buckets the allocation is split
	// into. It cannot be changed once the FlashSale exists.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="shards is immutable: the stock is split into this many Redis buckets once seeded"
	Shards *int32 `json:"shards,omitempty"`

	// maxPerUser is the number of units one buyer may hold (reserved or
	// bought) at once, across all shards.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	MaxPerUser *int32 `json:"maxPerUser,omitempty"`

	// schedule bounds the sale in time. Without it the sale is open as soon
	// as it is seeded and until it is deleted.
	// +optional
	Schedule *ScheduleSpec `json:"schedule,omitempty"`

	// paused stops admitting new reservations. Open reservations can still be
	// checked out and are still released when they expire.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// reservation configures reservation leases and the reservation API
	// Deployment.
	// +optional
	// +kubebuilder:default={}
	Reservation ReservationSpec `json:"reservation,omitempty"`

	// sweeper configures the process that releases expired reservations.
	// +optional
	// +kubebuilder:default={}
	Sweeper SweeperSpec `json:"sweeper,omitempty"`

	// pods places the sale's reserve and sweeper pods: the Secrets that pull
	// the operator's image, the nodes they may run on, and their priority.
	// +optional
	Pods *PodsSpec `json:"pods,omitempty"`

	// redis says where the stock shards live.
	// +required
	Redis RedisSpec `json:"redis,omitzero"`

	// postgres says where the ledger, the durable book of record, lives.
	// +required
	Postgres PostgresSpec `json:"postgres,omitzero"`

	// admission says where the key that signs waiting-room admission tokens
	// is.
	// +required
	Admission AdmissionSpec `json:"admission,omitzero"`
}

// ScheduleSpec is the time window of a sale. Either bound may be omitted.
// +kubebuilder:validation:XValidation:rule="!has(self.start) || !has(self.end) || self.end > self.start",message="schedule.end must be after schedule.start"
type ScheduleSpec struct {
	// The patterns are the RFC 3339 the operator can read: the API server's
	// date-time check alone also takes a lowercase t or z, and one such
	// FlashSale would stop the operator from listing any.

	// start is when the sale opens (RFC 3339 with an uppercase T, and Z or an
	// offset: 2026-12-01T09:00:00Z). Without it the sale opens as soon as it
	// is seeded.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`
	Start *metav1.Time `json:"start,omitempty"`

	// end is when the sale stops admitting reservations (RFC 3339, as start).
	// It must be after start.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`
	End *metav1.Time `json:"end,omitempty"`
}

// ReservationSpec configures reservation leases and the reservation API.
type ReservationSpec struct {
	// ttl is how long a reservation holds its units before it expires and
	// the sweeper may release them. It must be at least 1s (expiries are kept
	// in milliseconds) and at most 24h.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="reservation.ttl must be at least 1s"
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('24h')",message="reservation.ttl must be at most 24h"
	TTL *metav1.Duration `json:"ttl,omitempty"`

	// gracePeriod is how long after expiry the sweeper leaves a reservation
	// alone before giving its unit back, so that checkouts in flight at the
	// expiry time finish first. It does not extend the time to pay: a
	// checkout commits only before expiresAt, by the database clock. It may
	// be 0s, and at most 1h.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="reservation.gracePeriod must not be negative"
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('1h')",message="reservation.gracePeriod must be at most 1h"
	GracePeriod *metav1.Duration `json:"gracePeriod,omitempty"`

	// stealProbes is how many other shards, at most, a reservation tries
	// when its home shard is sold out.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2
	StealProbes *int32 `json:"stealProbes,omitempty"`

	// replicas is the number of reservation API pods.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	Replicas *int32 `json:"replicas,omitempty"`

	// resources are the compute resources of each reservation API pod. Its
	// memory grows with the buyers' connections to it (4,096 at once peaked
	// at 219–233 MiB under a 256Mi limit); the pod's Go runtime keeps to
	// nine tenths of limits.memory. Without them: requests of 100m CPU and
	// 128Mi memory (1,024 buyers at once), and no limits. Requests above
	// limits, negative CPU or memory, and claims are refused here rather
	// than by the Deployment's write.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.claims) || size(self.claims) == 0",message="reservation.resources.claims: the pods have no resource claims to use"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !('cpu' in self.requests) || !isQuantity(string(self.requests['cpu'])) || !quantity(string(self.requests['cpu'])).isLessThan(quantity('0'))",message="reservation.resources.requests.cpu must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !('memory' in self.requests) || !isQuantity(string(self.requests['memory'])) || !quantity(string(self.requests['memory'])).isLessThan(quantity('0'))",message="reservation.resources.requests.memory must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.limits) || !('cpu' in self.limits) || !isQuantity(string(self.limits['cpu'])) || !quantity(string(self.limits['cpu'])).isLessThan(quantity('0'))",message="reservation.resources.limits.cpu must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.limits) || !('memory' in self.limits) || !isQuantity(string(self.limits['memory'])) || !quantity(string(self.limits['memory'])).isLessThan(quantity('0'))",message="reservation.resources.limits.memory must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !has(self.limits) || !('cpu' in self.requests) || !('cpu' in self.limits) || !isQuantity(string(self.requests['cpu'])) || !isQuantity(string(self.limits['cpu'])) || quantity(string(self.requests['cpu'])).compareTo(quantity(string(self.limits['cpu']))) <= 0",message="reservation.resources.requests.cpu must be at most limits.cpu"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !has(self.limits) || !('memory' in self.requests) || !('memory' in self.limits) || !isQuantity(string(self.requests['memory'])) || !isQuantity(string(self.limits['memory'])) || quantity(string(self.requests['memory'])).compareTo(quantity(string(self.limits['memory']))) <= 0",message="reservation.resources.requests.memory must be at most limits.memory"
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// requestTimeout is the deadline of a buyer request (reserve, checkout,
	// cancel, the buyer's reservations) in a reservation API pod: its wait
	// for a place (at most half of it) and its Redis and SQL work. Past it
	// the buyer is answered 503 with Retry-After and retries with the same
	// idempotency key; a ledger batch already sent is waited for up to 5s
	// more, and a unit whose row was not written is given back within 5s.
	// At least 100ms, and at most 10s, so that a pod being stopped answers
	// the requests it took within its 25s drain.
	// +optional
	// +kubebuilder:default="5s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('100ms')",message="reservation.requestTimeout must be at least 100ms"
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('10s')",message="reservation.requestTimeout must be at most 10s"
	RequestTimeout *metav1.Duration `json:"requestTimeout,omitempty"`

	// maxInFlight is the most buyer requests (reserve, checkout, cancel, the
	// buyer's reservations) one reservation API pod takes in at once: up to
	// 1024 do their Redis and SQL work, the others wait in line for a place
	// (at most half of requestTimeout); one more is answered 503 with
	// Retry-After at once.
	// +optional
	// +kubebuilder:default=16384
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	MaxInFlight *int32 `json:"maxInFlight,omitempty"`
}

// SweeperSpec configures the process that releases expired reservations.
type SweeperSpec struct {
	// interval is the time between two sweeps. It must be at least 1s: a
	// shorter one would keep the sweeper querying PostgreSQL and Redis
	// without a pause; and at most 1h, as expired reservations wait for it.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="sweeper.interval must be at least 1s"
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('1h')",message="sweeper.interval must be at most 1h: expired reservations wait for it to be given back"
	Interval *metav1.Duration `json:"interval,omitempty"`

	// resources are the compute resources of each sweeper pod. Without
	// them: requests of 50m CPU and 64Mi memory, and no limits; set them
	// where a ResourceQuota asks every pod for limits or a LimitRange for
	// more, or the sweeper's pods are refused. Checked as the reservation
	// API pods' are.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.claims) || size(self.claims) == 0",message="sweeper.resources.claims: the pods have no resource claims to use"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !('cpu' in self.requests) || !isQuantity(string(self.requests['cpu'])) || !quantity(string(self.requests['cpu'])).isLessThan(quantity('0'))",message="sweeper.resources.requests.cpu must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !('memory' in self.requests) || !isQuantity(string(self.requests['memory'])) || !quantity(string(self.requests['memory'])).isLessThan(quantity('0'))",message="sweeper.resources.requests.memory must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.limits) || !('cpu' in self.limits) || !isQuantity(string(self.limits['cpu'])) || !quantity(string(self.limits['cpu'])).isLessThan(quantity('0'))",message="sweeper.resources.limits.cpu must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.limits) || !('memory' in self.limits) || !isQuantity(string(self.limits['memory'])) || !quantity(string(self.limits['memory'])).isLessThan(quantity('0'))",message="sweeper.resources.limits.memory must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !has(self.limits) || !('cpu' in self.requests) || !('cpu' in self.limits) || !isQuantity(string(self.requests['cpu'])) || !isQuantity(string(self.limits['cpu'])) || quantity(string(self.requests['cpu'])).compareTo(quantity(string(self.limits['cpu']))) <= 0",message="sweeper.resources.requests.cpu must be at most limits.cpu"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !has(self.limits) || !('memory' in self.requests) || !('memory' in self.limits) || !isQuantity(string(self.requests['memory'])) || !isQuantity(string(self.limits['memory'])) || quantity(string(self.requests['memory'])).compareTo(quantity(string(self.limits['memory']))) <= 0",message="sweeper.resources.requests.memory must be at most limits.memory"
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
}

// PodsSpec places the reserve and sweeper pods.
type PodsSpec struct {
	// imagePullSecrets name Secrets in the FlashSale's namespace that pull
	// the operator's image (the pods run it), for a private registry.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// nodeSelector keeps the pods on nodes with these labels (nodes set aside
	// for the drop).
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, !format.qualifiedName().validate(k).hasValue())",message="pods.nodeSelector keys must be label keys ([prefix/]name: name at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// tolerations let the pods run on tainted nodes (nodes set aside for
	// the drop). The API server's rules for a pod's tolerations are checked
	// here, so that a mistake is refused on apply rather than when the
	// sale's Deployments are written; only the format of keys and values is
	// left to that write (Ready then says ChildrenFailed and names it).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.operator) || t.operator in ['', 'Equal', 'Exists', 'Lt', 'Gt'])",message="pods.tolerations[].operator must be Equal, Exists, Lt or Gt"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.effect) || t.effect in ['', 'NoSchedule', 'PreferNoSchedule', 'NoExecute'])",message="pods.tolerations[].effect must be NoSchedule, PreferNoSchedule or NoExecute, or empty for all effects"
	// +kubebuilder:validation:XValidation:rule="self.all(t, (has(t.key) && t.key != '') || (has(t.operator) && t.operator == 'Exists'))",message="pods.tolerations[]: a toleration without a key must have operator Exists (it then tolerates every taint)"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.operator) || t.operator != 'Exists' || !has(t.value) || t.value == '')",message="pods.tolerations[]: operator Exists takes no value"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.tolerationSeconds) || (has(t.effect) && t.effect == 'NoExecute'))",message="pods.tolerations[].tolerationSeconds needs effect NoExecute"
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// priorityClassName is the PriorityClass of the pods, so that other
	// workloads are preempted before them during the sale.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == '' || !format.dns1123Subdomain().validate(self).hasValue()",message="pods.priorityClassName must be a PriorityClass name (lowercase letters, digits, '-' and '.')"
	PriorityClassName string `json:"priorityClassName,omitempty"`
}

// RedisSpec says where the stock shards live.
type RedisSpec struct {
	// mode is standalone (one server holds every shard) or cluster (the
	// addresses are seeds of a Redis Cluster).
	// +optional
	// +kubebuilder:default=standalone
	Mode RedisMode `json:"mode,omitempty"`

	// secretRef names a Secret in the FlashSale's namespace with the key
	// addresses (comma-separated host:port) and the optional keys username
	// and password.
	// +required
	SecretRef SecretNameReference `json:"secretRef,omitzero"`
}

// PostgresSpec says where the ledger lives.
type PostgresSpec struct {
	// secretRef selects the key of a Secret in the FlashSale's namespace that
	// holds the PostgreSQL connection string (postgres://...).
	// +required
	SecretRef PostgresSecretKeySelector `json:"secretRef,omitzero"`
}

// AdmissionSpec says where the admission-token key lives.
type AdmissionSpec struct {
	// secretRef selects the key of a Secret in the FlashSale's namespace that
	// holds the HMAC key shared with the waiting room.
	// +required
	SecretRef AdmissionSecretKeySelector `json:"secretRef,omitzero"`
}

// SecretNameReference names a Secret in the same namespace.
type SecretNameReference struct {
	// name is the name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name,omitempty"`
}

// PostgresSecretKeySelector selects the key of a Secret in the same
// namespace that holds a PostgreSQL connection string.
type PostgresSecretKeySelector struct {
	// name is the name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name,omitempty"`

	// key is the key in the Secret's data.
	// +optional
	// +kubebuilder:default=dsn
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +kubebuilder:validation:XValidation:rule="self != '.' && !self.startsWith('..')",message="postgres.secretRef.key must not be '.' or start with '..': a Secret cannot hold such a key"
	Key string `json:"key,omitempty"`
}

// AdmissionSecretKeySelector selects the key of a Secret in the same
// namespace that holds the admission HMAC key.
type AdmissionSecretKeySelector struct {
	// name is the name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name,omitempty"`

	// key is the key in the Secret's data. The reserve pods also read
	// "<key>.previous" (the key a rotation replaces), so it is at most 244
	// characters: a Secret key is at most 253.
	// +optional
	// +kubebuilder:default=hmac-key
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=244
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +kubebuilder:validation:XValidation:rule="self != '.' && !self.startsWith('..')",message="admission.secretRef.key must not be '.' or start with '..': a Secret cannot hold such a key"
	Key string `json:"key,omitempty"`
}

// FlashSale is a flash-sale campaign: one SKU sold from Redis stock shards,
// with PostgreSQL as the book of record. Its name also names the sale's
// Deployments and Service (<name>-reserve, <name>-sweeper), so it is a DNS-1035
// label of at most 55 characters.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.reservation.replicas,statuspath=.status.reservationReplicas,selectorpath=.status.reservationSelector
// +kubebuilder:resource:shortName=fs
// +kubebuilder:printcolumn:name="SKU",type=string,JSONPath=`.spec.sku`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Admitting",type=string,JSONPath=`.status.conditions[?(@.type=="Admitting")].status`
// +kubebuilder:printcolumn:name="Allocation",type=integer,JSONPath=`.status.allocation`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.available`
// +kubebuilder:printcolumn:name="Reserved",type=integer,JSONPath=`.status.reserved`
// +kubebuilder:printcolumn:name="Sold",type=integer,JSONPath=`.status.sold`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Degraded",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Start",type=string,JSONPath=`.spec.schedule.start`,priority=1
// +kubebuilder:printcolumn:name="End",type=string,JSONPath=`.spec.schedule.end`,priority=1
// +kubebuilder:printcolumn:name="Counted",type=date,JSONPath=`.status.countsObservedAt`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:optionalOldSelf=true,rule="oldSelf.hasValue() || (size(self.metadata.name) <= 55 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$'))",message="metadata.name must be at most 55 lowercase letters, digits and '-', starting with a letter and ending with a letter or digit: it names the sale's Deployments and Service (<name>-reserve, <name>-sweeper)"
type FlashSale struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the sale.
	// +required
	Spec FlashSaleSpec `json:"spec,omitzero"`

	// status is the observed state of the sale, written by the controller.
	// +optional
	Status FlashSaleStatus `json:"status,omitempty"`
}

// FlashSaleList is a list of FlashSales.
// +kubebuilder:object:root=true
type FlashSaleList struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// items are the FlashSales.
	Items []FlashSale `json:"items"`
}
