// Package failpoint names the steps of the money path where a test stops a
// process dead: with FLASHSALE_FAILPOINT=<step> in its environment, a process
// kills itself with SIGKILL when it reaches that step, so what it did before
// the step is done and nothing after it is. Unset (every deployment), a step
// costs a comparison with the empty string.
package failpoint

import (
	"os"
	"syscall"
)

// Env names the step to kill the process at.
const Env = "FLASHSALE_FAILPOINT"

// The steps of a reservation, in the order a steal meets them.
const (
	// ReserveAfterHomeReserve: the home shard reserved; no ledger row yet.
	ReserveAfterHomeReserve = "reserve-after-home-reserve"
	// ReserveAfterHomeClaim: the home shard was sold out and claimed the
	// buyer's quota; no shard probed yet.
	ReserveAfterHomeClaim = "reserve-after-home-claim"
	// ReserveAfterSteal: a steal probe reserved on another shard; its claim
	// not confirmed yet.
	ReserveAfterSteal = "reserve-after-steal"
	// ReserveAfterConfirm: the claim points at the stolen reservation; no
	// ledger row yet.
	ReserveAfterConfirm = "reserve-after-confirm"
	// ReserveAfterLedger: the PENDING row is committed; nothing answered yet.
	ReserveAfterLedger = "reserve-after-ledger"
	// ReserveBefore201: the answer is about to be written.
	ReserveBefore201 = "reserve-before-201"
)

// The steps of a checkout.
const (
	// CheckoutAfterLedger: the ledger committed the order (or found it
	// committed); the Redis reservation is not marked committed yet.
	CheckoutAfterLedger = "checkout-after-ledger"
)

// The steps of a sweep pass.
const (
	// SweepAfterLedgerCancel: the ledger cancelled a batch of expired
	// reservations (CANCELLED_BY_SWEEPER); none of their units is back in
	// Redis yet. The next pass releases them (the row already says so).
	SweepAfterLedgerCancel = "sweep-after-ledger-cancel"
)

// Steps lists every step of a reservation, for tests that visit them all.
var Steps = []string{
	ReserveAfterHomeReserve, ReserveAfterHomeClaim, ReserveAfterSteal,
	ReserveAfterConfirm, ReserveAfterLedger, ReserveBefore201,
}

var armed = os.Getenv(Env)

// Kill kills the process, at once and without cleanup, when step is the one
// named by FLASHSALE_FAILPOINT.
func Kill(step string) {
	if armed == "" || armed != step {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	// Not reached, unless the process is the init of its PID namespace (a
	// container's entrypoint, pid 1): the kernel drops a SIGKILL it sends
	// itself. It then ends at once all the same, with the status of a
	// SIGKILLed process (128+9), running nothing after the step.
	syscall.Exit(128 + int(syscall.SIGKILL))
}
