package controllers

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// rebuildPoll is how often a sale whose stock is being rebuilt is reconciled
// to report how far the rebuild got.
const rebuildPoll = time.Second

// rebuildStallAfter is how long a rebuild may go without progress (no
// batch of orders read from the ledger, none written to Redis) before the
// ledger is asked, on a new connection, whether it answers; one that does
// not is given up and retried: a server that stops answering without
// closing its connections would hold the sale closed for good.
const rebuildStallAfter = 2 * time.Minute

// rebuildRun is a rebuild of one sale's shards running off the reconcile: a
// reconcile that waited for it could not write the status meanwhile. The run
// is this process's handle on it (whether it still runs, which epoch it
// rebuilds at, its outcome); how far it got comes from the ledger and the
// shards (engine.RebuildProgress), like every other figure of the status.
type rebuildRun struct {
	cancel context.CancelFunc
	done   chan struct{} // closed once rep and err are set
	// epoch is the epoch the rebuild rebuilds at, once its start is in the
	// ledger (0 before).
	epoch atomic.Int64
	// What the reconcile that started it found: why the shards were lost,
	// whether the sale had ever been recorded as seeded, and the Redis
	// servers (address → run id) the rebuild writes to.
	why       string
	firstSeed bool
	servers   map[string]string

	rep engine.RebuildReport
	err error

	// stopped: the run was stopped (stop), not failed: its connections
	// were replaced or closed. onStop is a test's failpoint.
	stopped atomic.Bool
	onStop  func()
}

func (run *rebuildRun) over() bool {
	select {
	case <-run.done:
		return true
	default:
		return false
	}
}

// stop cancels the rebuild and waits for it to return.
func (run *rebuildRun) stop() {
	if !run.over() {
		run.stopped.Store(true)
	}
	run.cancel()
	if run.onStop != nil {
		run.onStop()
	}
	<-run.done
}

// interrupted: the run ended with an error because it was stopped, which
// is no failure of the rebuild: it is started again, for the same loss.
func (run *rebuildRun) interrupted() bool {
	return run.stopped.Load() && errors.Is(run.err, context.Canceled)
}

// rebuildStart is what a rebuild is started with.
type rebuildStart struct {
	why       string
	firstSeed bool
	servers   map[string]string
	spec      flashsalev1alpha1.FlashSaleSpec
}

// startRebuild runs the sale's rebuild on a goroutine of its own, bounded by
// the connections' life (a connection closed or replaced stops it) and the
// manager's (stopRebuilds), not by the reconcile that starts it. Its end
// queues a reconcile of the sale, which reports the outcome.
func (r *FlashSaleReconciler) startRebuild(ctx context.Context, s *scope, st rebuildStart) *rebuildRun {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	run := &rebuildRun{cancel: cancel, done: make(chan struct{}), why: st.why, firstSeed: st.firstSeed, servers: st.servers}
	if fp := r.rebuildStoppedFailpoint; fp != nil {
		ns, name := s.fs.Namespace, s.fs.Name
		run.onStop = func() { fp(ns, name) }
	}
	s.conn.rebuild.Store(run)
	eng := s.conn.engine
	obj := &flashsalev1alpha1.FlashSale{}
	obj.Namespace, obj.Name = s.fs.Namespace, s.fs.Name
	uid, spec := s.fs.UID, st.spec
	failpoint, begunFailpoint := r.rebuildFailpoint, r.rebuildBegunFailpoint
	r.rebuilds.add(run)
	go func() {
		defer r.rebuilds.remove(run)
		opts := engine.RebuildOptions{
			// The shards open in the state of the moment they open, from the
			// spec of that moment: a rebuild of a large ledger may run across
			// a schedule edge, or an on-call may pause the sale meanwhile (a
			// rebuilding shard has no open gate for applyGates to close).
			Gate: func() string {
				cur := &flashsalev1alpha1.FlashSale{}
				if err := r.Get(rctx, client.ObjectKeyFromObject(obj), cur); err == nil && cur.UID == uid {
					if !cur.DeletionTimestamp.IsZero() {
						return engine.StateEnded
					}
					spec = cur.Spec
				}
				return saleWindow(&spec, r.now()).Gate
			},
			// The schedule of the spec Gate just read.
			Schedule: func() (time.Time, time.Time) { return scheduleOf(&spec) },
			Begun: func(epoch int64) {
				run.epoch.Store(epoch)
				if begunFailpoint != nil {
					begunFailpoint(obj.Namespace, obj.Name)
				}
			},
			StallAfter: rebuildStallAfter,
		}
		if failpoint != nil {
			opts.BeforeFinish = func(shard int) { failpoint(obj.Namespace, obj.Name, shard) }
		}
		run.rep, run.err = eng.RebuildWith(rctx, opts)
		if run.err == nil {
			if ids, ok := rebuiltOn(rctx, eng, run.rep.Epoch); ok {
				run.servers = ids
			}
		}
		cancel()
		close(run.done)
		select {
		case r.rebuildEnded <- ctrlevent.GenericEvent{Object: obj}:
		default: // the next rebuildPoll reconcile finds it over
		}
	}()
	return run
}

// rebuiltOn is the servers holding the shards once a rebuild opened them,
// when every shard's meta names the server holding it now, at the rebuild's
// epoch: those are the servers it wrote to (each shard's begin records the
// server it began on, and the finish opens nothing elsewhere). So a server
// that restarted after the reconcile read the servers and before the rebuild
// reached it is not taken for a new loss, and recorded. One that restarted
// since the finish does not pass: the servers read before are kept, and the
// loss is found.
func rebuiltOn(ctx context.Context, eng *engine.Engine, epoch int64) (map[string]string, bool) {
	srv, err := eng.Servers(ctx)
	if err != nil {
		return nil, false
	}
	states, err := eng.Gates().ShardStates(ctx)
	if err != nil {
		return nil, false
	}
	for _, st := range states {
		if !st.Present || st.Unverified || st.Server == "" || st.Epoch != epoch {
			return nil, false
		}
	}
	return srv.RunIDs, true
}

// reportRebuilding records the running rebuild and how far it got, as the
// ledger and the shards say; the sale is reconciled again within rebuildPoll.
func (r *FlashSaleReconciler) reportRebuilding(ctx context.Context, s *scope, run *rebuildRun) {
	s.rebuilding, s.firstSeeding = true, run.firstSeed
	s.requeueAfter(rebuildPoll)
	epoch := run.epoch.Load()
	if epoch == 0 {
		// Not begun: the ledger's record is of an earlier rebuild.
		s.progress = &engine.RebuildProgress{Shards: s.conn.engine.Config().Shards}
		return
	}
	p, err := s.conn.engine.RebuildProgress(ctx)
	if err != nil || p.Epoch != epoch {
		// Not known now: the status keeps what it said.
		return
	}
	s.progress = &p
}

// rebuilds are the rebuilds the reconciler runs, stopped when the manager
// stops (or loses its lease) so that none writes after another manager took
// over.
type rebuilds struct {
	mu   sync.Mutex
	runs map[*rebuildRun]bool
}

func (rs *rebuilds) add(run *rebuildRun) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.runs == nil {
		rs.runs = map[*rebuildRun]bool{}
	}
	rs.runs[run] = true
}

func (rs *rebuilds) remove(run *rebuildRun) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	delete(rs.runs, run)
}

// stopAll cancels every running rebuild and waits for them to return.
func (rs *rebuilds) stopAll() {
	rs.mu.Lock()
	runs := make([]*rebuildRun, 0, len(rs.runs))
	for run := range rs.runs {
		runs = append(runs, run)
	}
	rs.mu.Unlock()
	for _, run := range runs {
		run.stop()
	}
}

// stopRebuilds is a runnable of the manager: when it stops, so do the
// rebuilds.
func (r *FlashSaleReconciler) stopRebuilds(ctx context.Context) error {
	<-ctx.Done()
	r.rebuilds.stopAll()
	return nil
}

// rebuildRetryMax bounds the wait between rebuilds that fail in a row.
const rebuildRetryMax = time.Minute

// rebuildBackoff spaces the rebuilds of a sale that fail in a row for a
// reason a person must mend (counters that drifted, a server that may evict
// keys): 3 s, then twice as long each time, at most a minute. Each try reads
// the whole ledger and sends events. Other failures (an outage, a server
// that failed over during the rebuild) are tried again after 3 s. A new spec
// generation tries at once; a healthy pass starts the count over.
type rebuildBackoff struct {
	n          int
	err        error // the last failure's
	generation int64 // the spec's when it failed
	next       time.Time
}

// lastingFailure: a rebuild failure that trying again does not mend.
func lastingFailure(err error) bool {
	return errors.Is(err, engine.ErrCountsDrift) || errors.Is(err, engine.ErrEvictionPolicy)
}

// failedAgain records a failure at now and returns how long until the next
// try.
func (b *rebuildBackoff) failedAgain(err error, generation int64, now time.Time) time.Duration {
	d := retryUnhealthy
	if lastingFailure(err) {
		b.n++
		d = rebuildRetryMax
		if b.n <= 5 {
			d = min(retryUnhealthy<<(b.n-1), rebuildRetryMax)
		}
	} else {
		b.n = 0
	}
	b.err, b.generation, b.next = err, generation, now.Add(d)
	return d
}

// wait returns how long until the next try and the last failure while a
// rebuild must not start yet, or nil.
func (b *rebuildBackoff) wait(generation int64, now time.Time) (time.Duration, error) {
	if b.err == nil || generation != b.generation || !now.Before(b.next) {
		return 0, nil
	}
	return b.next.Sub(now), b.err
}
