package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/flashsale-dev/flashsale-operator/internal/failpoint"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// lostHome resolves a home shard call that answered err: the script may have
// run, and its reply been lost, or it may still run (a stalled server runs
// what it had read). What it did is on the home shard (stock.Store.Resolve):
//   - this attempt's claim: the home shard is sold out, and the steal goes on
//     as if the CLAIMED answer had arrived, so the claim is confirmed or given
//     back now and the buyer is not held BUSY and at the limit until the reaper;
//   - a reservation of the request: answered as a retry would be (a replay);
//   - nothing: the call is fenced, so that arriving late it takes nothing.
//
// When the home shard cannot be read either, whatever the call did stays for
// the sweeper (a claim, for its reaper).
func (e *Engine) lostHome(ctx context.Context, req stock.ReserveRequest, err error) (ReserveResult, error) {
	res := ReserveResult{Calls: 1}
	if stock.NotRun(err) {
		// Refused before it ran (a redirect, a slot being migrated): it did
		// nothing, and asking the shard would meet the same refusal.
		return res, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	cctx, cancel := detached(ctx)
	l, lerr := e.store.Resolve(cctx, req.Shard, req.Key, req.Attempt)
	cancel()
	switch {
	case lerr != nil:
		return res, fmt.Errorf("%w: %v (and reading shard %d: %v)", ErrUnavailable, err, req.Shard, lerr)
	case l.Claim != "":
		e.markSoldOut(req.Shard, req.Quantity)
		return e.steal(ctx, res, req, l.Claim, l.Held)
	case l.Placed && l.Reservation.User == req.User:
		// This call's reservation, or an earlier attempt's (the call then
		// answered REPLAY): this attempt cannot tell which, so it writes no
		// row, and waits as a replay does for the original's.
		return e.replay(ctx, res, req.Shard, req.Key, req.User)
	}
	return res, fmt.Errorf("%w: %v", ErrUnavailable, err)
}

// canSteal reports whether a buyer homed on home could be placed elsewhere:
// stealing is on and some other shard is not known to be sold out. When none
// is, the home shard's script claims nothing.
func (e *Engine) canSteal(home int) bool {
	if e.cfg.StealProbes == 0 || e.cfg.Shards < 2 {
		return false
	}
	for s := range e.cfg.Shards {
		if s != home && !e.knownSoldOut(s) {
			return true
		}
	}
	return false
}

// steal tries other shards after the home shard was sold out and the user's quota
// was claimed there (claim is the claim's stamp; held, what the user held before
// it). Each probe is its own script call on one shard.
func (e *Engine) steal(ctx context.Context, res ReserveResult, req stock.ReserveRequest, claim string, held int64) (ReserveResult, error) {
	home := req.Shard
	unclaim := func() error {
		cctx, cancel := detached(ctx)
		defer cancel()
		_, err := e.store.Unclaim(cctx, home, req.Key, claim)
		return err
	}
	closed := ""      // why the first closed shard probed refused
	var refused error // the first refusal of a shard that did not run the call
	for _, t := range e.stealOrder(home) {
		req.Shard, req.Mode = t, stock.ModeSteal
		r, err := e.store.Reserve(ctx, req)
		res.Calls++
		if stock.NotRun(err) {
			// It did nothing on t (a slot being migrated, a redirect): the
			// next shard may serve, and the claim goes back if none does,
			// rather than hold the buyer at the limit until the reaper.
			refused = cmp.Or(refused, err)
			continue
		}
		if err != nil {
			// The script may have run and its reply been lost: what it did is
			// on shard t. A unit it took there belongs to this claim; one an
			// earlier attempt took is a replay (placedBy).
			placed, found, lerr := e.placedBy(ctx, t, req)
			switch {
			case lerr != nil:
				// Cannot tell: the claim stays, so the quota covers a unit that
				// may be on t; the reaper gives it back once any such
				// reservation has expired, and the sweeper releases that.
				return ReserveResult{Calls: res.Calls}, fmt.Errorf("%w: %v (and reading shard %d: %v)", ErrUnavailable, err, t, lerr)
			case !found:
				_ = unclaim()
				return ReserveResult{Calls: res.Calls}, fmt.Errorf("%w: %v", ErrUnavailable, err)
			}
			r = placed
		}
		e.seeEpoch(r.Epoch)
		switch r.Code {
		case stock.Replay:
			// An earlier attempt of this request left its reservation here; its own
			// claim holds the quota, so this attempt's claim is given back.
			_ = unclaim()
			return e.replay(ctx, res, t, req.Key, req.User)
		case stock.Reserved:
			failpoint.Kill(failpoint.ReserveAfterSteal)
			cctx, cancel := detached(ctx)
			ok, err := e.store.ConfirmClaim(cctx, home, req.Key, claim, t, r.ExpiryMs)
			cancel()
			if err != nil || !ok {
				// The claim vanished (the home shard lost its data), or the
				// confirm's answer did: give the unit back rather than risk the
				// limit. The release gives back the quota if the confirm ran (the
				// pointer then names this reservation); otherwise the claim is
				// still this attempt's, and goes back too. Both are exact, so
				// neither gives back twice.
				e.release(ctx, t, req.Key, r.ExpiryMs, r.Epoch)
				if err != nil {
					_ = unclaim()
				}
				return ReserveResult{Calls: res.Calls}, fmt.Errorf("%w: the user's quota on shard %d was lost or not confirmed: %v", ErrUnavailable, home, err)
			}
			failpoint.Kill(failpoint.ReserveAfterConfirm)
			return e.materialize(ctx, res, t, req.Key, req.User, req.Quantity, r)
		case stock.SoldOut:
			e.markSoldOut(t, req.Quantity)
		case stock.Closed:
			closed = cmp.Or(closed, r.Status)
		}
		// Closed or sold out there: try the next shard.
	}
	if err := unclaim(); err != nil {
		return ReserveResult{Calls: res.Calls}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if refused != nil {
		// A shard that refused the call may hold stock: SOLD_OUT would be wrong.
		return ReserveResult{Calls: res.Calls}, fmt.Errorf("%w: %v", ErrUnavailable, refused)
	}
	res.Outcome = OutcomeSoldOut
	if closed != "" {
		// A closed shard may still hold stock (being rebuilt, unverified after
		// a failover): SOLD_OUT, which clients do not retry, would be wrong.
		res.Outcome, res.Reason = OutcomeClosed, closed
		return res, nil
	}
	if held > 0 {
		return e.orFromLedger(ctx, res, req.Key, req.User)
	}
	return res, nil
}

// placedBy looks at shard t for the reservation a steal call of req made
// there, after that call's reply was lost: found with the script's answer as
// if it had arrived, or not found when there is none of this buyer's placed
// under this home shard. When there is no reservation of the key at all, the
// call is fenced (stock.Store.Resolve): arriving late, it takes nothing on t.
//
// A reservation found is this call's (RESERVED) or an earlier attempt's, and
// then the call answered REPLAY. Only an earlier attempt can have written its
// ledger row, since this one writes it after the answer: a row says REPLAY.
// Taken for this call's, it would meet that row as a duplicate and be given
// back, though it may be paid for.
func (e *Engine) placedBy(ctx context.Context, t int, req stock.ReserveRequest) (stock.ShardResult, bool, error) {
	cctx, cancel := detached(ctx)
	defer cancel()
	l, err := e.store.Resolve(cctx, t, req.Key, req.Attempt)
	r := l.Reservation
	if err != nil || !l.Placed || r.Status != stock.ResReserved || r.User != req.User || r.Home != req.Home || r.Quantity != req.Quantity {
		return stock.ShardResult{}, false, err
	}
	placed := stock.ShardResult{Code: stock.Reserved, ExpiryMs: r.ExpiryMs, Epoch: r.Epoch, Status: stock.ResReserved}
	switch _, err := e.ledger.GetOrder(cctx, e.cfg.CampaignID, stock.FormatID(t, req.Key)); {
	case err == nil:
		placed.Code, placed.Extra = stock.Replay, -1
	case !errors.Is(err, ledger.ErrNotFound):
		return stock.ShardResult{}, false, fmt.Errorf("ledger: %w", err)
	}
	return placed, true, nil
}
