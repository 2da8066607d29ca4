// Package sweeper runs the engine's sweep pass of one campaign on an interval,
// on the one replica that holds the leadership (a Kubernetes Lease or a
// PostgreSQL advisory lock), with Prometheus metrics and health endpoints.
package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// Pass is one sweep over every shard (engine.Engine.Sweep).
type Pass func(ctx context.Context) (engine.SweepStats, error)

// Elector decides which replica sweeps.
//
// Correctness never depends on it: the engine's sweep is safe with two
// sweepers at once (the ledger cancel and the release script are both
// conditional, so a unit is released once). Leadership only saves the
// duplicate work of several replicas scanning the same shards.
type Elector interface {
	// Acquire is called before every pass: it takes leadership or confirms it
	// is still held, and reports whether this replica should sweep now.
	Acquire(ctx context.Context) (bool, error)
	// Release gives leadership up; called once, after the last pass.
	Release(ctx context.Context) error
	// Kind names the mechanism for logs ("lease", "advisory-lock").
	Kind() string
}

// DefaultPassTimeout bounds one pass. It stays under Kubernetes' default
// termination grace period (30s), so a SIGTERM that waits for the current
// pass never turns into a SIGKILL in the middle of it.
const DefaultPassTimeout = 25 * time.Second

// releaseTimeout bounds giving up the lock or Lease on shutdown.
const releaseTimeout = 5 * time.Second

// Runner sweeps every Interval while it leads.
type Runner struct {
	Pass        Pass
	Elector     Elector
	Interval    time.Duration
	PassTimeout time.Duration // 0 means DefaultPassTimeout
	Metrics     *Metrics      // may be nil
	Log         *slog.Logger  // may be nil

	busySince atomic.Int64 // when the current election and pass began (unix ns); 0 between passes
}

// Live is the liveness check (/healthz): an error once one turn of the loop
// (the election, then a pass) has run for more than twice the pass's limit.
// Every call a turn makes is bounded, so only a call that ignores its
// deadline gets there; the kubelet then restarts the process, where a
// sweeper stuck for ever would look healthy while no unit came back.
func (r *Runner) Live() error {
	since := r.busySince.Load()
	if since == 0 {
		return nil
	}
	if d, limit := time.Since(time.Unix(0, since)), 2*r.passTimeout(); d > limit {
		return fmt.Errorf("a sweep has run for %s, more than twice its limit (%s): the loop is stuck", d.Round(time.Second), r.passTimeout())
	}
	return nil
}

func (r *Runner) passTimeout() time.Duration {
	if r.PassTimeout <= 0 {
		return DefaultPassTimeout
	}
	return r.PassTimeout
}

// Run sweeps until ctx is cancelled. A pass in progress when ctx is cancelled
// runs to its end (it is not interrupted half way between the ledger and
// Redis); then leadership is released and Run returns nil.
func (r *Runner) Run(ctx context.Context) error {
	if r.Pass == nil || r.Elector == nil {
		return errors.New("sweeper: Pass and Elector are required")
	}
	if r.Interval <= 0 {
		return errors.New("sweeper: the interval must be positive")
	}
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r.Metrics.setInterval(r.Interval)
	leading := false
	timer := time.NewTimer(0) // the first pass runs at once
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return r.release(log, leading)
		case <-timer.C:
		}
		if ctx.Err() != nil { // both were ready: stopping wins
			return r.release(log, leading)
		}
		r.busySince.Store(time.Now().UnixNano())
		// Not cut by a SIGTERM arriving now: a cancelled ping would read as a
		// lost lock. The elector bounds its own calls.
		now, err := r.Elector.Acquire(context.WithoutCancel(ctx))
		if err != nil {
			log.Warn("leader election", "kind", r.Elector.Kind(), "err", err)
		}
		if now != leading {
			leading = now
			if leading {
				log.Info("leading: this replica sweeps", "kind", r.Elector.Kind())
			} else {
				log.Info("following: another replica sweeps", "kind", r.Elector.Kind())
			}
		}
		r.Metrics.setLeader(leading)
		if ctx.Err() != nil {
			// Stopped while asking: no pass, which with the election and the
			// release would outlast the termination grace.
			r.busySince.Store(0)
			return r.release(log, leading)
		}
		next := r.Interval
		if leading && r.pass(ctx, log) {
			next = 0 // a backlog: go on at once
		}
		r.busySince.Store(0)
		timer.Reset(next)
	}
}

// pass runs one pass; more reports a backlog the next pass goes on with at
// once: the pass stopped at its time limit with work done, or left shards with
// expired reservations past their budget (SweepStats.Backlog).
func (r *Runner) pass(ctx context.Context, log *slog.Logger) (more bool) {
	timeout := r.passTimeout()
	// Detached from ctx: SIGTERM lets the pass finish instead of cutting it
	// between a ledger cancel and its Redis release (the next pass would repair
	// that, but there is no reason to leave work for it).
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	start := time.Now()
	st, err := r.Pass(pctx)
	d := time.Since(start)
	cut := err != nil && errors.Is(err, context.DeadlineExceeded) && pctx.Err() != nil &&
		st.Released+st.Committed+st.Abandoned+st.ReapedClaims > 0
	r.Metrics.observePass(st, d, err, cut)
	fields := []any{"duration", d, "released", st.Released, "committed", st.Committed, "abandoned", st.Abandoned,
		"skipped", st.Skipped, "reaped_claims", st.ReapedClaims, "quota_deferred", st.QuotaDeferred}
	switch {
	case cut:
		log.Info("sweep pass reached its time limit; the next goes on at once", fields...)
	case err != nil:
		log.Error("sweep pass failed", append([]any{"err", err}, fields...)...)
	case st.QuotaDeferred > 0:
		// The home shards' claim reapers give it back once they answer.
		log.Warn("sweep pass could not give back the quota of some stolen reservations on their home shards",
			append(fields, "backlog_shards", st.Backlog, "err", st.DeferredBecause)...)
	case st.Released+st.Committed+st.Abandoned+st.ReapedClaims > 0:
		log.Info("sweep pass", append(fields, "backlog_shards", st.Backlog)...)
	default:
		log.Debug("sweep pass", "duration", d, "skipped", st.Skipped)
	}
	// A backlog goes on at once even after an error: the error may be one
	// shard's (a Redis Cluster master that does not answer), the backlog
	// the others'.
	return cut || st.Backlog > 0
}

func (r *Runner) release(log *slog.Logger, leading bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	err := r.Elector.Release(ctx)
	r.Metrics.setLeader(false)
	if err != nil {
		// Not fatal: the lock dies with the session and the Lease expires.
		log.Warn("releasing leadership", "kind", r.Elector.Kind(), "err", err)
	} else if leading {
		log.Info("released leadership", "kind", r.Elector.Kind())
	}
	return nil
}
