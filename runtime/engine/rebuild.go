package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// RebuildReport records one rebuild.
type RebuildReport struct {
	Epoch     int64
	Available int64
	Reserved  int64
	Sold      int64
	Restored  int64  // pending reservations recreated in Redis
	Holders   int64  // buyers whose units went back to the per-user limit
	Expired   int    // pending orders past expiry found by the rebuild and cancelled
	Gate      string // the state the shards were opened in
	Duration  time.Duration
}

const (
	// rebuildBatch bounds the reservations (or users fields) per script call.
	rebuildBatch = 200
	// rebuildReadBatch is how many ledger rows are read before they are
	// handed to the writers; with rebuildQueue it bounds the rebuild's memory.
	rebuildReadBatch = 1000
	rebuildQueue     = 8
	rebuildWriters   = sweepParallel
	// rebuildReaders is how many ledger connections read at once, each
	// shard's pending orders on one of them: with the shards on a Redis
	// Cluster, their masters are written to at once. The manager's pool per
	// sale has 4; the ledger leaves one of any pool to others.
	rebuildReaders = 3
)

// Rebuild reconstructs every shard from the ledger after Redis lost its data.
//
//  1. The ledger bumps the epoch and cancels the expired pending orders
//     (ledger.BeginRebuild); writes racing it were either counted or fenced.
//  2. Every shard is closed (REBUILDING, the new epoch) and wiped.
//  3. One ledger snapshot is streamed (ledger.ReadRebuild), shard by shard
//     on up to rebuildReaders connections at once: the pending orders become
//     reservations again, so checkout and the sweeper keep working on them,
//     and every buyer's held units (pending and committed) go back to the
//     per-user limit. Writers send them to Redis while the next rows are
//     read; memory stays at a few batches whatever the sale's size.
//  4. Each shard gets its stock (allocation − committed − pending, the
//     committed units from the ledger's counters) and its meta, still closed.
//  5. Once every shard is whole they are opened together in the state gate
//     returns then. It is asked at that moment, not before: a rebuild of a
//     large ledger may run across a schedule edge.
//
// A committed order is not recreated: a retried request of a paid reservation
// is answered from the ledger (see Reserve).
//
// Once the epoch is bumped the rebuild's start and epoch are recorded in the
// ledger, so that RebuildProgress tells from the ledger and the shards how far
// it got.
func (e *Engine) Rebuild(ctx context.Context, gate func() string) (RebuildReport, error) {
	return e.RebuildWith(ctx, RebuildOptions{Gate: gate})
}

// RebuildOptions are a rebuild's gate and its failpoint.
type RebuildOptions struct {
	// Gate returns the state the shards open in, asked once they are whole.
	Gate func() string
	// Schedule, when set, returns the sale's start and end (zero: none),
	// asked right after Gate and written into the shards before they open
	// (stock.Store.SetWindow): a shard that lost its data lost them too.
	Schedule func() (start, end time.Time)
	// Begun, when set, is told the epoch the rebuild rebuilds at once its
	// start is recorded: from then on RebuildProgress speaks of this rebuild.
	Begun func(epoch int64)
	// BeforeFinish, when set, runs before each shard is finished (its stock
	// and meta written, still closed): a failpoint, so a test can hold a
	// rebuild with exactly the shards it let through finished.
	BeforeFinish func(shard int)
	// StallAfter, when set, gives the rebuild up with ErrRebuildStalled once
	// it made no progress for that long (no batch of the ledger's orders
	// read, none written to Redis, no step done) and the ledger does not
	// answer a new connection either: a call to a server that stopped
	// answering without closing the connection never returns.
	StallAfter time.Duration
}

// RebuildWith is Rebuild with its options.
func (e *Engine) RebuildWith(ctx context.Context, o RebuildOptions) (rep RebuildReport, err error) {
	if o.Gate == nil {
		return RebuildReport{}, fmt.Errorf("%w: a rebuild needs a gate", ErrInvalid)
	}
	start := e.now()
	// Failed or not, the report says how long it ran.
	defer func() { rep.Duration = e.now().Sub(start) }()
	ctx, watch := watchStall(ctx, o.StallAfter, e.ledger.Answers)
	defer watch.stop()
	defer func() { err = watch.explain(ctx, err) }()
	// Before the epoch is bumped: stock rebuilt where it may be evicted again
	// would not stay what the ledger says.
	if err := e.store.CheckEviction(ctx); err != nil {
		return RebuildReport{}, fmt.Errorf("redis: %w", err)
	}
	snap, err := e.ledger.BeginRebuild(ctx, e.cfg.CampaignID, e.cfg.Grace)
	if err != nil {
		return RebuildReport{}, ledgerFailure("rebuild snapshot", err)
	}
	watch.tick()
	c := snap.Campaign
	if c.Shards != e.cfg.Shards || len(c.ShardAllocations) != c.Shards {
		return RebuildReport{}, fmt.Errorf("the ledger has %d shards for this campaign, not %d", c.Shards, e.cfg.Shards)
	}
	e.seeEpoch(c.Epoch)
	rep = RebuildReport{Epoch: c.Epoch, Expired: snap.Expired}
	if err := e.ledger.RecordRebuildStart(ctx, e.cfg.CampaignID, ledger.RebuildStart{Time: start, Epoch: c.Epoch}); err != nil {
		return rep, ledgerFailure("rebuild start", err)
	}
	watch.tick()
	if o.Begun != nil {
		o.Begun(c.Epoch)
	}
	if err := e.eachShard(ctx, func(ctx context.Context, i int) error {
		defer watch.tick()
		return e.store.RebuildBegin(ctx, i, c.Epoch)
	}); err != nil {
		return rep, fmt.Errorf("rebuild: closing the shards: %w", err)
	}

	w := e.newRebuildWriter(ctx, c.Epoch, watch)
	counts, rerr := e.ledger.ReadRebuild(w.ctx, e.cfg.CampaignID, c.Shards, ledger.RebuildReader{
		Batch: rebuildReadBatch, Readers: rebuildReaders, Pending: w.pending, Holders: w.holders,
	})
	// A writer stopped by the rebuild's own end (the ledger stalled) is
	// not what failed: the read is.
	if werr := w.wait(); werr != nil && (rerr == nil || !errors.Is(werr, context.Cause(ctx))) {
		return rep, fmt.Errorf("rebuild: %w", werr)
	}
	if rerr != nil {
		return rep, ledgerFailure("rebuild read", rerr)
	}
	rep.Restored, rep.Holders = w.restored.Load(), w.users.Load()

	units := make([]int64, c.Shards)
	for i, n := range counts {
		units[i] = c.ShardAllocations[i] - n.Committed - n.Pending
		if units[i] < 0 {
			// The ledger holds more than the shard's allocation: never invent stock.
			return rep, fmt.Errorf("rebuild shard %d: ledger holds %d committed and %d pending units, more than the allocation %d",
				i, n.Committed, n.Pending, c.ShardAllocations[i])
		}
		rep.Available += units[i]
		rep.Reserved += n.Pending
		rep.Sold += n.Committed
	}
	// Each shard is finished closed and the gate opened on all of them at the
	// end: a rebuild that fails on one shard admits nothing.
	if err := e.eachShard(ctx, func(ctx context.Context, i int) error {
		if o.BeforeFinish != nil {
			o.BeforeFinish(i)
		}
		defer watch.tick()
		return e.store.RebuildFinish(ctx, i, units[i], c.Epoch, stock.StateFailClosed, c.ShardAllocations[i], c.LastChangeID)
	}); err != nil {
		return rep, fmt.Errorf("rebuild: %w", err)
	}
	rep.Gate = o.Gate()
	if o.Schedule != nil {
		start, end := o.Schedule()
		if _, err := e.store.SetWindow(ctx, start, end); err != nil {
			return rep, fmt.Errorf("rebuild: writing the schedule: %w", err)
		}
	}
	out, err := e.store.SetGateRebuilt(ctx, rep.Gate, c.Epoch)
	if err == nil {
		err = gateOutcome(out, c.Epoch)
	}
	if err != nil {
		// Shards are written one by one: close again those that opened, on
		// a context of its own (the open may have failed on a spent one).
		cctx, cancel := detached(ctx)
		_, _ = e.store.SetGate(cctx, stock.StateFailClosed, 0)
		cancel()
		return rep, fmt.Errorf("rebuild: setting the gate: %w", err)
	}
	return rep, nil
}

// RebuildProgress is how far the last rebuild to start got, as the ledger
// and the shards say.
type RebuildProgress struct {
	// Started is when it started (zero: no rebuild ever started).
	Started time.Time
	// Epoch is the epoch it rebuilds at.
	Epoch int64
	// Shards is the sale's number of shards; Finished how many of them the
	// rebuild has made whole (stock and meta at Epoch, still closed or
	// opened since).
	Shards, Finished int
}

// RebuildProgress reads how far the last rebuild to start got: its start
// from the ledger, and from every shard's meta whether it finished it. It
// says nothing of whether that rebuild still runs (one cut short stays where
// it stopped); the caller knows that of its own.
func (e *Engine) RebuildProgress(ctx context.Context) (RebuildProgress, error) {
	rec, err := e.ledger.GetRecord(ctx, e.cfg.CampaignID)
	if err != nil {
		return RebuildProgress{}, ledgerFailure("campaign record", err)
	}
	p := RebuildProgress{Shards: e.cfg.Shards}
	if rec.RebuildStarted == nil {
		return p, nil
	}
	p.Started, p.Epoch = rec.RebuildStarted.Time, rec.RebuildStarted.Epoch
	states, err := e.store.State(ctx)
	if err != nil {
		return p, fmt.Errorf("redis: %w", err)
	}
	for _, st := range states {
		if st.Present && st.Epoch == p.Epoch && st.State != stock.StateRebuilding {
			p.Finished++
		}
	}
	return p, nil
}

// eachShard runs fn for every shard, sweepParallel at a time, and returns
// the first error (naming its shard).
func (e *Engine) eachShard(ctx context.Context, fn func(context.Context, int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, sweepParallel)
	)
	for i := range e.cfg.Shards {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, i); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("shard %d: %w", i, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// rebuildWriter sends what the ledger streams to Redis from rebuildWriters
// goroutines, through a short queue: the ledger read waits when Redis is
// behind, so memory stays bounded. The first error stops both.
type rebuildWriter struct {
	e      *Engine
	epoch  int64
	watch  *stallWatch // told of each batch read and each written
	ctx    context.Context
	cancel context.CancelCauseFunc
	jobs   chan func(context.Context) error
	wg     sync.WaitGroup

	restored, users atomic.Int64
}

func (e *Engine) newRebuildWriter(ctx context.Context, epoch int64, watch *stallWatch) *rebuildWriter {
	w := &rebuildWriter{e: e, epoch: epoch, watch: watch, jobs: make(chan func(context.Context) error, rebuildQueue)}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	for range rebuildWriters {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for job := range w.jobs {
				if w.ctx.Err() != nil {
					continue // drain after a failure
				}
				if err := job(w.ctx); err != nil {
					w.cancel(err)
				}
				w.watch.tick()
			}
		}()
	}
	return w
}

func (w *rebuildWriter) submit(job func(context.Context) error) error {
	select {
	case w.jobs <- job:
		return nil
	case <-w.ctx.Done():
		return context.Cause(w.ctx)
	}
}

// wait lets the writers finish and returns the first Redis error, if any.
func (w *rebuildWriter) wait() error {
	close(w.jobs)
	w.wg.Wait()
	err := context.Cause(w.ctx)
	w.cancel(nil)
	return err
}

// pending turns a batch of pending orders into reservations on their shards,
// and into pointers on their buyers' home shards when they were stolen. It is
// called by several ledger readers at once.
func (w *rebuildWriter) pending(_ context.Context, orders []ledger.Order) error {
	w.watch.tick()
	shards := w.e.cfg.Shards
	byShard := map[int][]stock.Reservation{}
	pointers := map[int][]string{}
	for _, o := range orders {
		_, key, err := stock.ParseID(o.ReservationID, shards)
		if err != nil {
			return fmt.Errorf("order %s: %w", o.ReservationID, err)
		}
		home := stock.HomeShard(o.UserID, shards)
		rs, ok := byShard[o.Shard]
		if !ok {
			// A call holds one shard's orders (ledger.RebuildReader): sized once.
			rs = make([]stock.Reservation, 0, len(orders))
		}
		byShard[o.Shard] = append(rs, stock.Reservation{
			Key: key, Shard: o.Shard, User: o.UserID, Quantity: o.Quantity, Status: stock.ResReserved,
			ExpiryMs: o.ExpiresAt.UnixMilli(), Epoch: o.Epoch, Home: home, CreatedMs: o.CreatedAt.UnixMilli(),
		})
		if o.Shard != home {
			pointers[home] = append(pointers[home], stock.PointerFieldPrefix+key, stock.Pointer(o.Shard, o.ExpiresAt.UnixMilli()),
				stock.BuyerField(key), stock.Buyer(o.Quantity, o.UserID))
		}
	}
	for shard, rs := range byShard {
		for j := 0; j < len(rs); j += rebuildBatch {
			part := rs[j:min(j+rebuildBatch, len(rs))]
			if err := w.submit(func(ctx context.Context) error {
				if err := w.e.store.RebuildRestore(ctx, shard, w.epoch, part); err != nil {
					return err
				}
				w.restored.Add(int64(len(part)))
				return nil
			}); err != nil {
				return err
			}
		}
	}
	return w.sendUsers(pointers, 0)
}

// holders gives every buyer's held units back to the users hash of their home
// shard.
func (w *rebuildWriter) holders(_ context.Context, hs []ledger.Holder) error {
	w.watch.tick()
	shards := w.e.cfg.Shards
	fields := map[int][]string{}
	for _, h := range hs {
		home := stock.HomeShard(h.UserID, shards)
		fs, ok := fields[home]
		if !ok {
			// Sized for an even spread of buyers over the shards.
			fs = make([]string, 0, 2*(len(hs)/shards+16))
		}
		fields[home] = append(fs, h.UserID, strconv.FormatInt(h.Units, 10))
	}
	return w.sendUsers(fields, 1)
}

// sendUsers writes users-hash fields per home shard; counted says whether a
// pair is a buyer (for the report) or a pointer.
func (w *rebuildWriter) sendUsers(fields map[int][]string, counted int64) error {
	for home, fs := range fields {
		for j := 0; j < len(fs); j += 2 * rebuildBatch {
			part := fs[j:min(j+2*rebuildBatch, len(fs))]
			if err := w.submit(func(ctx context.Context) error {
				if err := w.e.store.RebuildUsers(ctx, home, w.epoch, part); err != nil {
					return err
				}
				w.users.Add(counted * int64(len(part)/2))
				return nil
			}); err != nil {
				return err
			}
		}
	}
	return nil
}
