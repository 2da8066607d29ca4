package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/failpoint"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// SweepBatch is how many expired reservations of a shard one step handles.
const SweepBatch = 256

// sweepParallel bounds how many shards are swept at once.
const sweepParallel = 4

// sweepShardBatches bounds the batches of expired reservations one pass
// releases on a shard, and those of its paying marks and stale claims: a pass visits every shard, so a backlog on the first
// ones (taken server by server as each tells its clock, sweepParallel at a
// time) does not keep the others' expired units, nor any shard's repairs,
// waiting for it to drain.
// A pass that leaves a backlog says so (SweepStats.Backlog), and the next
// one starts at once.
const sweepShardBatches = 8

// SweepStats counts what one pass did.
type SweepStats struct {
	Released  int // units' reservations given back to stock
	Committed int // committed in the ledger: only Redis was cleaned (expired, or marked paying)
	Abandoned int // no ledger row (the API died before writing it): recorded, released
	Skipped   int // not yet expired by the database clock, ended by another writer during the pass, or shard being rebuilt
	// ReapedClaims counts quota given back on home shards: claims for stealing
	// whose placing process died (see Config.ClaimSlack), and released stolen
	// reservations whose give-back had failed.
	ReapedClaims int
	// Backlog counts the shards left with expired reservations, paying marks
	// or stale claims when the pass reached their budget (sweepShardBatches):
	// the next pass goes on.
	Backlog int
	// QuotaDeferred counts released stolen reservations whose quota give-back
	// on their home shard failed, or was not sent after one to that shard
	// failed in the pass: that shard's claim reaper gives it back once it
	// answers (reapClaims), and their own shard's sweep goes on.
	// DeferredBecause is the first of those failures.
	QuotaDeferred   int
	DeferredBecause error
}

func (s *SweepStats) add(o SweepStats) {
	s.Released += o.Released
	s.Committed += o.Committed
	s.Abandoned += o.Abandoned
	s.Skipped += o.Skipped
	s.ReapedClaims += o.ReapedClaims
	s.Backlog += o.Backlog
	s.QuotaDeferred += o.QuotaDeferred
	s.DeferredBecause = cmp.Or(s.DeferredBecause, o.DeferredBecause)
}

// Sweep makes one pass over every shard: expired reservations (expiry + grace, by the
// clock of the shard's Redis server) are cancelled in the ledger first, then released
// atomically in Redis.
// Two sweepers running at once release each unit once: the ledger update and the
// release script are both conditional. Then it gives back the quota of claims
// older than TTL + grace + ClaimSlack that were never confirmed: their placing
// process died, and without this the user would stay at the limit. A
// reservation a checkout committed in the ledger but not in Redis (its process
// died between the two) is settled on the first pass after it, whatever its
// expiry (settlePaying).
func (e *Engine) Sweep(ctx context.Context) (SweepStats, error) {
	var (
		mu    sync.Mutex
		total SweepStats
		first error
		wg    sync.WaitGroup
		sem   = make(chan struct{}, sweepParallel)
	)
	// Each server's shards start as soon as it has told its clock: one
	// that does not answer holds back its own shards only.
	e.store.EachShardClock(ctx, func(shards []int, now time.Time, err error) {
		if err != nil {
			mu.Lock()
			first = cmp.Or(first, fmt.Errorf("sweep shards %v: redis time: %w", shards, err))
			mu.Unlock()
			return
		}
		for _, shard := range shards {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				st, err := e.sweepOne(ctx, shard, now)
				mu.Lock()
				defer mu.Unlock()
				total.add(st)
				if err != nil && first == nil {
					first = fmt.Errorf("sweep shard %d: %w", shard, err)
				}
			}()
		}
	})
	wg.Wait()
	return total, first
}

// sweepOne is Sweep's pass over one shard, by now, the clock of the shard's
// own server read when the pass began with that server: the one its
// expiries, paying marks and claims were written by (on a Redis Cluster
// each master has its own). A reading older than the shard's turn (it
// waited for a sweep slot) only holds back what expired meanwhile until the
// next pass: every decision here is about what is older than a cutoff.
func (e *Engine) sweepOne(ctx context.Context, shard int, now time.Time) (SweepStats, error) {
	st, err := e.sweepShard(ctx, shard, now.Add(-e.cfg.Grace).UnixMilli())
	var more bool
	if err == nil {
		var paid int
		paid, more, err = e.settlePaying(ctx, shard, now)
		st.Committed += paid
	}
	if err == nil {
		var reapMore bool
		st.ReapedClaims, reapMore, err = e.reapClaims(ctx, shard, now.Add(-e.cfg.TTL-e.cfg.Grace-e.cfg.ClaimSlack))
		more = more || reapMore
	}
	if more {
		st.Backlog = 1
	}
	return st, err
}

// batchBudget is how many batches each step of a pass takes on one shard
// (sweepShardBatches, or a test's).
func (e *Engine) batchBudget() int { return cmp.Or(e.sweepBudget, sweepShardBatches) }

func (e *Engine) sweepShard(ctx context.Context, shard int, cutoff int64) (SweepStats, error) {
	var total SweepStats
	failing := map[int]error{} // home shards whose give-backs failed in this pass
	budget, offset := e.batchBudget(), 0
	for batch := 1; ; batch++ {
		keys, err := e.store.Expired(ctx, shard, cutoff, offset, SweepBatch)
		if err != nil || len(keys) == 0 {
			return total, err
		}
		st, err := e.sweepBatch(ctx, shard, keys, failing)
		total.add(st)
		if e.sweptBatch != nil {
			e.sweptBatch()
		}
		if err != nil {
			return total, err
		}
		// Skipped ones stay in the index: the next batch steps over them,
		// and none follows a batch that made no progress.
		offset += st.Skipped
		if len(keys) < SweepBatch || st.Skipped == len(keys) {
			return total, nil
		}
		if batch == budget {
			total.Backlog = 1
			return total, nil
		}
	}
}

// reapClaims gives back the quota of shard's claims made at or before cutoff
// whose reservation was never confirmed placed (the placing process died), and
// settles the quota of placed ones the ledger has decided: a sold reservation
// keeps it, an ended and released one gives it back. The second case is the
// release whose give-back on the home shard failed (a Redis error, or a crash
// between the two scripts): nothing else would ever give that quota back.
// Claims left in the index (their reservation not swept yet) are stepped
// over, not listed again; more says the pass's budget ran out first.
func (e *Engine) reapClaims(ctx context.Context, shard int, cutoff time.Time) (reaped int, more bool, err error) {
	offset, progress := 0, 0
	for batch := 1; ; batch++ {
		keys, err := e.store.StaleClaims(ctx, shard, cutoff, offset, SweepBatch)
		if err != nil || len(keys) == 0 {
			return reaped, false, err
		}
		before := progress
		for _, k := range keys {
			ok, placed, err := e.store.ReapClaimAt(ctx, shard, k, cutoff)
			settled := ok
			if err == nil && placed.Shard >= 0 {
				ok, settled, err = e.settlePlacedQuota(ctx, shard, placed, k)
			}
			if err != nil {
				return reaped, false, err
			}
			if ok {
				reaped++
			}
			if settled {
				progress++
			} else {
				offset++
			}
		}
		if len(keys) < SweepBatch {
			return reaped, false, nil
		}
		if batch == e.batchBudget() {
			// Another pass at once only if the last batch changed something:
			// a pass that ends among claims left for now would read them all
			// again, and go no further.
			return reaped, progress > before, nil
		}
	}
}

// settlePlacedQuota decides the home-shard quota of a stolen reservation placed
// as p says, past its expiry. It reports whether it gave quota back and
// whether the claims index let go of the entry.
func (e *Engine) settlePlacedQuota(ctx context.Context, home int, p stock.Placement, key string) (gaveBack, settled bool, err error) {
	target, expiryMs := p.Shard, p.ExpiryMs
	o, err := e.ledger.GetOrder(ctx, e.cfg.CampaignID, stock.FormatID(target, key))
	missing := errors.Is(err, ledger.ErrNotFound)
	if err != nil && !missing {
		return false, false, err
	}
	switch {
	case !missing && o.Status == ledger.StatusCommitted:
		_, err := e.store.Quota(ctx, home, stock.QuotaForget, o.UserID, key, o.Quantity, target, expiryMs)
		return false, err == nil, err
	case !missing && o.Status == ledger.StatusPending:
		return false, false, nil // not swept yet
	}
	r, found, err := e.store.GetReservation(ctx, target, key)
	if err != nil || found && r.Status == stock.ResReserved {
		// Still in Redis: the sweep releases it (or, without a row, records it
		// abandoned) first.
		return false, false, err
	}
	// Cancelled or abandoned, and the unit back in stock: so is the quota.
	user, qty := o.UserID, o.Quantity
	if missing {
		// Gone from Redis and never in the ledger: its write failed and the
		// unit was given back, and giving the quota back failed (a Redis
		// error, or the process died between the two). The field beside the
		// pointer names the buyer; a pointer without it (an older version's)
		// names no one, and the index only lets go of it.
		if p.User == "" {
			_, err := e.store.Quota(ctx, home, stock.QuotaForget, "", key, 0, target, expiryMs)
			return false, err == nil, err
		}
		user, qty = p.User, p.Quantity
	}
	gaveBack, err = e.store.Quota(ctx, home, stock.QuotaRelease, user, key, qty, target, expiryMs)
	return gaveBack, err == nil, err
}

func (e *Engine) sweepBatch(ctx context.Context, shard int, listed []stock.Listed, failing map[int]error) (SweepStats, error) {
	var st SweepStats
	keys := make([]string, len(listed))
	ids := make([]string, len(listed))
	for i, l := range listed {
		keys[i], ids[i] = l.Key, stock.FormatID(shard, l.Key)
	}
	status, err := e.ledger.CancelExpired(ctx, e.cfg.CampaignID, ids, e.cfg.Grace)
	if err != nil {
		return st, err
	}
	failpoint.Kill(failpoint.SweepAfterLedgerCancel)
	// Tokens without a ledger row: the API died between Redis and SQL. Record the
	// abandonment first, so a late materialization cannot also write a PENDING row.
	var missing []ledger.Order
	for i, k := range keys {
		if _, ok := status[ids[i]]; ok {
			continue
		}
		r, found, err := e.store.GetReservation(ctx, shard, k)
		if err != nil {
			return st, err
		}
		if !found || r.ExpiryMs != listed[i].ExpiryMs {
			// Already released by someone else (the release below cleans the
			// index), or another placement of the request since: a retry's,
			// young, whose own row may be on its way.
			continue
		}
		missing = append(missing, ledger.Order{
			ReservationID: ids[i], CampaignID: e.cfg.CampaignID, SKU: e.cfg.SKU, UserID: r.User,
			Shard: shard, Quantity: r.Quantity, Status: ledger.StatusAbandoned, Epoch: r.Epoch,
			ExpiresAt: time.UnixMilli(r.ExpiryMs),
		})
	}
	if len(missing) > 0 {
		got, wrote, err := e.ledger.RecordAbandoned(ctx, missing)
		if err != nil {
			return st, err
		}
		maps.Copy(status, got)
		// Only the rows this pass wrote: another sweeper's pass (one still
		// running after its lease moved) may have recorded the others.
		st.Abandoned += wrote
	}
	// A key that fails leaves the others to be done: the first error is
	// returned, and the next pass finds what it left in the expiry index.
	var (
		release []stock.Listed
		first   error
	)
	for i, k := range keys {
		s, ok := status[ids[i]]
		switch {
		case !ok, s == ledger.StatusCancelledBySweeper, s == ledger.StatusCancelledByUser, s == ledger.StatusAbandoned:
			// The placement listed, and only it: the request may have given
			// it back itself since and a retry of it placed another, which
			// it told "reserved".
			release = append(release, listed[i])
		case s == ledger.StatusCommitted:
			n, err := e.store.MarkCommitted(ctx, shard, k)
			if err == nil && n == stock.CommitLedgerNeeded {
				n, err = e.markCommittedFromLedger(ctx, shard, k)
			}
			switch {
			case err != nil:
				first = cmp.Or(first, err)
			case n == stock.CommitRebuilding:
				st.Skipped++
			default:
				st.Committed++
			}
		default: // PENDING: not past expiry + grace by the database clock yet, or ended by another writer meanwhile
			st.Skipped++
		}
	}
	released, err := e.releaseExpired(ctx, shard, release, failing)
	st.add(released)
	return st, cmp.Or(first, err)
}

// releaseExpired gives back the units of keys on shard, which the ledger has
// ended: their release scripts go together (Store.ReleaseEach), then the
// quota of the stolen ones among them together on each home shard
// (Store.QuotaEach, as afterRelease gives one back); one whose hash is gone
// is released from its ledger row, on its own. A release is counted by what
// Redis did, even when its give-back failed; reapClaims settles that one. A
// give-back's failure is another shard's (the home shard's server stalls, on
// a Redis Cluster another master): it is counted, not returned, so that this
// shard's remaining batches, paying marks and claims are not held back, and
// the later give-backs to that shard in the pass (failing) are not sent:
// each would wait for a server that does not answer.
func (e *Engine) releaseExpired(ctx context.Context, shard int, listed []stock.Listed, failing map[int]error) (SweepStats, error) {
	var (
		st    SweepStats
		first error
		gives = map[int][]stock.QuotaGive{} // by home shard
	)
	results, errs := e.store.ReleaseEach(ctx, shard, listed)
	for i, l := range listed {
		rr, err := results[i], errs[i]
		switch {
		case err != nil:
		case rr.Code == stock.LedgerNeeded:
			rr, err = e.releaseFromLedger(ctx, shard, l) // gives the quota back itself
		default:
			if g, ok := quotaGiveBack(shard, l.Key, rr); ok {
				gives[rr.Home] = append(gives[rr.Home], g)
			}
		}
		switch rr.Code {
		case stock.Released:
			st.Released++
		case stock.Rebuilding:
			st.Skipped++
		}
		first = cmp.Or(first, err)
	}
	for home, g := range gives {
		if err := failing[home]; err != nil {
			st.QuotaDeferred += len(g)
			continue
		}
		_, errs := e.store.QuotaEach(ctx, home, g)
		for _, err := range errs {
			if err != nil {
				st.QuotaDeferred++
				st.DeferredBecause = cmp.Or(st.DeferredBecause, err)
				failing[home] = cmp.Or(failing[home], err)
			}
		}
	}
	return st, first
}

// releaseFromLedger releases a reservation whose Redis hash is gone (it
// outlived its backstop TTL: the sweeper was down that long) from its ledger
// row, which has all the release needs.
func (e *Engine) releaseFromLedger(ctx context.Context, shard int, l stock.Listed) (stock.ReleaseResult, error) {
	o, err := e.ledger.GetOrder(ctx, e.cfg.CampaignID, stock.FormatID(shard, l.Key))
	if errors.Is(err, ledger.ErrNotFound) {
		// No row and no hash: nothing says what it held; the index entry goes.
		return e.store.ReleaseFromLedger(ctx, shard, l, 0, 0, "")
	}
	if err != nil {
		return stock.ReleaseResult{}, err
	}
	rr, err := e.store.ReleaseFromLedger(ctx, shard, l, o.Quantity, o.ExpiresAt.UnixMilli(), o.UserID)
	if err != nil {
		return rr, err
	}
	return rr, e.afterRelease(ctx, shard, l.Key, rr)
}

// markCommittedFromLedger is the sold counterpart of releaseFromLedger: the
// units of a sold reservation whose hash is gone leave the reserved count.
func (e *Engine) markCommittedFromLedger(ctx context.Context, shard int, key string) (int, error) {
	o, err := e.ledger.GetOrder(ctx, e.cfg.CampaignID, stock.FormatID(shard, key))
	if err != nil {
		return 0, err
	}
	return e.store.MarkCommittedFromLedger(ctx, shard, key, o.Quantity, o.ExpiresAt.UnixMilli())
}
