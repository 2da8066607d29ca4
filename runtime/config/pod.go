package config

import (
	"os"
	"strconv"
	"time"
)

// The pod contract: what the controller's reserve and sweeper Deployments set
// and what the `reserve` and `sweeper` commands in those pods read, besides
// the campaign's variables above. Both sides use these names only, so a
// rename is one edit (controllers' pod contract test parses the rendered
// Deployments with the commands' own flags).
const (
	// EnvPrefix starts every variable of the pod contract: the operator owns
	// those of its Deployments, and puts back any others add or change.
	EnvPrefix = "FLASHSALE_"

	// EnvListen is where the pod serves HTTP: the reservation API (reserve),
	// the probes and /metrics (sweeper).
	EnvListen = "FLASHSALE_LISTEN"
	// EnvMetricsListen, on reserve pods, serves /metrics apart from the API.
	EnvMetricsListen = "FLASHSALE_METRICS_LISTEN"
	// EnvDebugListen, on reserve pods, serves Go profiles (never exposed).
	EnvDebugListen = "FLASHSALE_DEBUG_LISTEN"

	// The sweeper's pass interval and how its one active replica is elected
	// (LeaderLockAuto, LeaderLockLease or LeaderLockPostgres).
	EnvSweepInterval = "FLASHSALE_SWEEP_INTERVAL"
	EnvLeaderLock    = "FLASHSALE_LEADER_LOCK"

	// Tuning of the reserve pods (runtime/api, the ledger writer, the GC).
	EnvRateLimit         = "FLASHSALE_RATE_LIMIT"
	EnvRateBurst         = "FLASHSALE_RATE_BURST"
	EnvRequestTimeout    = "FLASHSALE_REQUEST_TIMEOUT"
	EnvReadHeaderTimeout = "FLASHSALE_READ_HEADER_TIMEOUT"
	EnvReadTimeout       = "FLASHSALE_READ_TIMEOUT"
	EnvWriteTimeout      = "FLASHSALE_WRITE_TIMEOUT"
	EnvIdleTimeout       = "FLASHSALE_IDLE_TIMEOUT"
	EnvMaxBodyBytes      = "FLASHSALE_MAX_BODY_BYTES"
	EnvMaxInFlight       = "FLASHSALE_MAX_IN_FLIGHT"
	EnvAvailabilityCache = "FLASHSALE_AVAILABILITY_CACHE"
	EnvShutdownTimeout   = "FLASHSALE_SHUTDOWN_TIMEOUT"
	EnvDrainDelay        = "FLASHSALE_DRAIN_DELAY"
	EnvLedgerWriters     = "FLASHSALE_LEDGER_WRITERS"
	EnvLedgerLinger      = "FLASHSALE_LEDGER_LINGER"
	EnvGCPercent         = "FLASHSALE_GC_PERCENT"
	// EnvMemoryLimit is the container's memory limit in bytes, which the
	// operator passes to the reserve pods from the downward API.
	EnvMemoryLimit = "FLASHSALE_MEMORY_LIMIT"
	// The reserve script calls batched per Redis server (stock.PipelineConfig):
	// the most calls in one pipeline (0 or 1: none batched), how long a
	// pipeline waits for more, and how many may be out at once.
	EnvReservePipeline  = "FLASHSALE_RESERVE_PIPELINE"
	EnvReserveLinger    = "FLASHSALE_RESERVE_LINGER"
	EnvReservePipelines = "FLASHSALE_RESERVE_PIPELINES"
	// EnvStealSeed seeds the shards a reserve pod's steals probe
	// (engine.Config.Rand), so that a storm replays by seed; unset or 0:
	// drawn at random.
	EnvStealSeed = "FLASHSALE_STEAL_SEED"
)

// Leader lock kinds of the sweeper (EnvLeaderLock, --leader-lock).
const (
	LeaderLockAuto     = "auto"     // a Lease when there is an API server, else PostgreSQL
	LeaderLockLease    = "lease"    // a coordination.k8s.io Lease (needs RBAC on leases)
	LeaderLockPostgres = "postgres" // a PostgreSQL session advisory lock
)

// Ports of the data-plane containers and their names in the pod spec. The
// reserve pods serve /metrics on PortMetrics, which their Service does not
// expose: buyers reach the API only.
const (
	PortHTTP        = 8080
	PortMetrics     = 9090
	PortNameHTTP    = "http"
	PortNameMetrics = "metrics"
)

// Paths the reserve and sweeper pods serve for their probes and scrapes.
const (
	PathHealthz = "/healthz" // liveness: the process serves
	PathReadyz  = "/readyz"  // readiness: Redis and the ledger answer
	PathMetrics = "/metrics"
)

// StartupTimeout bounds how long the reserve and sweeper commands take to
// open the ledger (connect, and migrate on a first start) before they listen:
// past it they exit. The controller's startup probe waits at least this long
// before liveness applies, so the kubelet never kills a pod still within it.
const StartupTimeout = 30 * time.Second

// ListenAddr is the listen address of port on every interface (":8080").
func ListenAddr(port int) string { return ":" + strconv.Itoa(port) }

// DefaultListen is EnvListen's default: the pods' HTTP port.
var DefaultListen = ListenAddr(PortHTTP)

// EnvString is the environment variable name, or def when it is unset or empty.
func EnvString(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
