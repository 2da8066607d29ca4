package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/failpoint"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Outcome is the business answer to a reserve call.
type Outcome string

const (
	OutcomeReserved Outcome = "RESERVED" // a new reservation, durable in the ledger
	OutcomeReplayed Outcome = "REPLAYED" // the same request again: the original reservation
	OutcomeSoldOut  Outcome = "SOLD_OUT"
	OutcomeLimit    Outcome = "LIMIT_EXCEEDED"
	OutcomeClosed   Outcome = "CLOSED"  // Reason says why (NOT_STARTED, PAUSED, ENDED, ...)
	OutcomeBusy     Outcome = "BUSY"    // the same request is still being placed: retry
	OutcomeExpired  Outcome = "EXPIRED" // this request's reservation is gone (expired or cancelled): use a new request id
	// OutcomeKeyReused: the request id already holds a reservation of another
	// quantity (Reservation); nothing was taken for this call.
	OutcomeKeyReused Outcome = "KEY_REUSED"
)

// ErrInvalid marks a request the engine refuses before touching anything.
var ErrInvalid = errors.New("invalid request")

// ErrNoIDSecret is Reserve's answer on an engine configured without the
// reservation id secret (a sweeper's): it cannot derive ids, so it touches nothing.
var ErrNoIDSecret = errors.New("engine has no reservation id secret: it cannot reserve")

// ErrUnavailable means the reservation could not be made durable (ledger down or
// fenced by a rebuild, Redis unreachable). Nothing was acknowledged; units taken
// were given back or are left for the sweeper.
var ErrUnavailable = errors.New("reservation service unavailable")

// Reservation is an acknowledged reservation.
type Reservation struct {
	ID        string
	Shard     int
	Quantity  int
	ExpiresAt time.Time
	Epoch     int64
}

// ReserveResult is the answer to Reserve.
type ReserveResult struct {
	Outcome     Outcome
	Reservation Reservation // Reserved and Replayed
	Reason      string      // Closed: the gate state or NO_META, STALE_EPOCH
	Held        int64       // Limit: units the user already holds
	Calls       int         // reserve script calls made (home + steals), also with an error
}

// Reserve takes quantity units for a user; requestID is the client's idempotency key.
func (e *Engine) Reserve(ctx context.Context, user, requestID string, quantity int) (ReserveResult, error) {
	res, err := e.reserve(ctx, user, requestID, quantity)
	if err == nil && res.Outcome == OutcomeReplayed && res.Reservation.Quantity != quantity {
		// The same key with another quantity is another request: answering with
		// the original reservation would tell the client it holds what it asked.
		res.Outcome = OutcomeKeyReused
	}
	return res, err
}

func (e *Engine) reserve(ctx context.Context, user, requestID string, quantity int) (ReserveResult, error) {
	if len(e.cfg.IDSecret) == 0 {
		return ReserveResult{}, ErrNoIDSecret
	}
	if user == "" || requestID == "" {
		return ReserveResult{}, fmt.Errorf("%w: user and request id are required", ErrInvalid)
	}
	if strings.HasPrefix(user, stock.PointerFieldPrefix) {
		// A shard's users hash holds the buyers' units under their ids and the
		// stolen reservations' pointers under this prefix: such a buyer's
		// units and a request's pointer would share one field.
		return ReserveResult{}, fmt.Errorf("%w: user ids starting with %q are reserved", ErrInvalid, stock.PointerFieldPrefix)
	}
	if quantity < 1 || quantity > e.cfg.MaxPerUser {
		return ReserveResult{}, fmt.Errorf("%w: quantity must be 1..%d, got %d", ErrInvalid, e.cfg.MaxPerUser, quantity)
	}
	if e.ledgerRefuses() {
		return ReserveResult{}, fmt.Errorf("%w: the ledger is failing or slow: no unit is taken that it could not record", ErrUnavailable)
	}
	key := e.keys.Key(e.cfg.CampaignID, user, requestID)
	home := stock.HomeShard(user, e.cfg.Shards)
	mode := stock.ModeHome
	if e.canSteal(home) {
		mode = stock.ModeClaim
	}
	req := stock.ReserveRequest{
		Shard: home, Home: home, Mode: mode, User: user, Key: key, Quantity: quantity,
		MaxPerUser: e.cfg.MaxPerUser, TTL: e.cfg.TTL, MinEpoch: e.minEpoch.Load(), Attempt: e.newAttempt(),
	}
	r, err := e.store.Reserve(ctx, req)
	if err != nil {
		return e.lostHome(ctx, req, err)
	}
	e.seeEpoch(r.Epoch)
	res := ReserveResult{Calls: 1}
	switch r.Code {
	case stock.Reserved:
		failpoint.Kill(failpoint.ReserveAfterHomeReserve)
		return e.materialize(ctx, res, home, key, user, quantity, r)
	case stock.Replay:
		shard := home
		if r.Extra >= 0 {
			shard = int(r.Extra)
		}
		return e.replay(ctx, res, shard, key, user)
	case stock.SoldOut:
		e.markSoldOut(home, quantity)
		res.Outcome = OutcomeSoldOut
		if r.Extra > 0 {
			// The buyer holds units: this may be one of their requests whose
			// Redis record is gone (sold, and past the hash's backstop).
			return e.orFromLedger(ctx, res, key, user)
		}
	case stock.Limit:
		// A request whose Redis record is gone (a paid one after a rebuild,
		// which recreates pending reservations only) finds its buyer at the
		// limit: the ledger answers it.
		res.Outcome, res.Held = OutcomeLimit, r.Extra
		return e.orFromLedger(ctx, res, key, user)
	case stock.Closed:
		res.Outcome, res.Reason = OutcomeClosed, r.Status
	case stock.Busy:
		res.Outcome = OutcomeBusy
	case stock.Claimed:
		e.markSoldOut(home, quantity)
		failpoint.Kill(failpoint.ReserveAfterHomeClaim)
		return e.steal(ctx, res, req, r.Status, r.Extra)
	default:
		return ReserveResult{Calls: res.Calls}, fmt.Errorf("reserve: unexpected script code %v", r.Code)
	}
	return res, nil
}

// orFromLedger answers res unless the ledger has a row for the request key:
// then the request was placed before and Redis no longer knows it (its
// reservation ended, or its hash is gone), and the row is the answer (I4).
func (e *Engine) orFromLedger(ctx context.Context, res ReserveResult, key, user string) (ReserveResult, error) {
	o, err := e.ledger.GetRequestOrder(ctx, e.cfg.CampaignID, key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return res, nil
	case err != nil:
		return ReserveResult{Calls: res.Calls}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	res.Held = 0
	return e.answerFromOrder(res, o, user), nil
}

// materialize writes the PENDING row before anyone is told "reserved". When the row
// is certainly not written, the unit goes back at once; when the commit outcome is
// unknown, the reservation is left to expire and the sweeper decides from the ledger.
func (e *Engine) materialize(ctx context.Context, res ReserveResult, shard int, key, user string, qty int, r stock.ShardResult) (ReserveResult, error) {
	o := ledger.Order{
		ReservationID: stock.FormatID(shard, key),
		CampaignID:    e.cfg.CampaignID,
		SKU:           e.cfg.SKU,
		UserID:        user,
		Shard:         shard,
		Quantity:      qty,
		Status:        ledger.StatusPending,
		Epoch:         r.Epoch,
		ExpiresAt:     time.UnixMilli(r.ExpiryMs),
	}
	err := e.mat.Submit(ctx, o)
	e.ledgerWrote(err)
	switch {
	case err == nil:
		failpoint.Kill(failpoint.ReserveAfterLedger)
		res.Outcome = OutcomeReserved
		res.Reservation = Reservation{ID: o.ReservationID, Shard: shard, Quantity: qty, ExpiresAt: o.ExpiresAt, Epoch: r.Epoch}
		return res, nil
	case errors.Is(err, ledger.ErrDuplicate):
		// The ledger already has this request's reservation, on this shard or
		// another (its Redis record was released or lost): give back what we
		// just took and answer from the book of record.
		e.release(ctx, shard, key, r.ExpiryMs, r.Epoch)
		return e.fromLedger(ctx, res, key, user)
	case errors.Is(err, ledger.ErrAmbiguous):
		return ReserveResult{Calls: res.Calls}, fmt.Errorf("%w: ledger commit outcome unknown, the reservation will expire: %v", ErrUnavailable, err)
	default:
		e.release(ctx, shard, key, r.ExpiryMs, r.Epoch)
		return ReserveResult{Calls: res.Calls}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
}

// replayWait bounds how long a replay waits for the original request's ledger row.
const (
	replayWait = time.Second
	replayPoll = 10 * time.Millisecond
)

// replay answers a repeated request. Only the original request writes the ledger row
// (a replay writing it could resurrect a unit the original already gave back), so
// the replay waits a moment for that row.
func (e *Engine) replay(ctx context.Context, res ReserveResult, shard int, key, user string) (ReserveResult, error) {
	id := stock.FormatID(shard, key)
	deadline := e.now().Add(replayWait)
	for {
		// By request, not by id: the request's row may be another shard's.
		o, err := e.ledger.GetRequestOrder(ctx, e.cfg.CampaignID, key)
		if err == nil {
			e.stuck.forget(id)
			out := e.answerFromOrder(res, o, user)
			if out.Outcome == OutcomeExpired && o.UserID == user && o.Shard == shard {
				e.releaseEnded(ctx, shard, key, o)
			}
			return out, nil
		}
		if !errors.Is(err, ledger.ErrNotFound) {
			return ReserveResult{Calls: res.Calls}, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		if e.now().After(deadline) {
			if out, done, err := e.abandonStuck(ctx, res, shard, key, user); done || err != nil {
				return out, err
			}
			res.Outcome = OutcomeBusy
			return res, nil
		}
		select {
		case <-ctx.Done():
			return ReserveResult{Calls: res.Calls}, ctx.Err()
		case <-time.After(replayPoll):
		}
	}
}

// abandonStuck settles a replayed reservation that this engine has seen
// without a ledger row for Config.SettleStuckAfter: no request is left that
// could write the row (a request's deadline and a ledger batch's timeout are
// far shorter). Its process died, or lost the script's answer (a Redis stall,
// a retried call); its key and the buyer's quota would otherwise be held until
// the sweeper's turn, after TTL and grace. It is settled as the sweeper would:
// ABANDONED in the ledger first (a late write of the original row then finds
// it and its caller answers EXPIRED; if that row won, it is the answer), then
// the unit and the quota come back. done is false when it is not settled now.
//
// The time is this process's own, from its first sight of the stuck replay:
// neither the Redis clock nor the TTL (which may have changed since the
// reservation was made) can make a young reservation look old.
func (e *Engine) abandonStuck(ctx context.Context, res ReserveResult, shard int, key, user string) (_ ReserveResult, done bool, _ error) {
	id := stock.FormatID(shard, key)
	r, found, err := e.store.GetReservation(ctx, shard, key)
	if err != nil {
		return res, false, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if !found || r.Status != stock.ResReserved || r.User != user {
		e.stuck.forget(id)
		return res, false, nil
	}
	// Timed per reservation, not per id: the same request retried after its
	// reservation was given back places a new one, which starts young.
	if e.stuck.since(id, r.ExpiryMs, e.now(), e.cfg.SettleStuckAfter) < e.cfg.SettleStuckAfter {
		return res, false, nil
	}
	got, _, err := e.ledger.RecordAbandoned(ctx, []ledger.Order{{
		ReservationID: id, CampaignID: e.cfg.CampaignID, SKU: e.cfg.SKU, UserID: r.User,
		Shard: shard, Quantity: r.Quantity, Status: ledger.StatusAbandoned, Epoch: r.Epoch,
		ExpiresAt: time.UnixMilli(r.ExpiryMs),
	}})
	if err != nil {
		return res, false, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if s, ok := got[id]; !ok || s == ledger.StatusAbandoned {
		// Abandoned now, or no row at all: the request has its row on
		// another shard, and this reservation is not the request's.
		e.release(ctx, shard, key, r.ExpiryMs, r.Epoch)
	}
	e.stuck.forget(id)
	out, err := e.fromLedger(ctx, res, key, user)
	return out, true, err
}

// stuckReplays remembers when each replay without a ledger row was first
// seen, and the expiry of the reservation seen. It holds at most
// maxStuckReplays entries; older ones are dropped.
type stuckReplays struct {
	mu    sync.Mutex
	first map[string]stuckReplay
}

type stuckReplay struct {
	seen     time.Time
	expiryMs int64
}

const maxStuckReplays = 10_000

// since returns how long the reservation id with this expiry has been seen
// stuck (0 the first time, and when id now holds another reservation).
func (s *stuckReplays) since(id string, expiryMs int64, now time.Time, after time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.first[id]; ok && t.expiryMs == expiryMs {
		return now.Sub(t.seen)
	}
	if s.first == nil {
		s.first = map[string]stuckReplay{}
	}
	if _, ok := s.first[id]; !ok && len(s.first) >= maxStuckReplays {
		for k, t := range s.first {
			if now.Sub(t.seen) > 4*after {
				delete(s.first, k)
			}
		}
		if len(s.first) >= maxStuckReplays {
			return 0 // full of recent ones: this one waits for the sweeper
		}
	}
	s.first[id] = stuckReplay{now, expiryMs}
	return 0
}

func (s *stuckReplays) forget(id string) {
	s.mu.Lock()
	delete(s.first, id)
	s.mu.Unlock()
}

// fromLedger answers from the row of the request whose key is key.
func (e *Engine) fromLedger(ctx context.Context, res ReserveResult, key, user string) (ReserveResult, error) {
	o, err := e.ledger.GetRequestOrder(ctx, e.cfg.CampaignID, key)
	if err != nil {
		return ReserveResult{Calls: res.Calls}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return e.answerFromOrder(res, o, user), nil
}

func (e *Engine) answerFromOrder(res ReserveResult, o ledger.Order, user string) ReserveResult {
	switch {
	case o.UserID != user || o.CampaignID != e.cfg.CampaignID:
		// Cannot happen with HMAC-derived ids; refuse rather than reveal anything.
		res.Outcome = OutcomeExpired
	case o.Status == ledger.StatusPending || o.Status == ledger.StatusCommitted:
		res.Outcome = OutcomeReplayed
		res.Reservation = Reservation{ID: o.ReservationID, Shard: o.Shard, Quantity: o.Quantity, ExpiresAt: o.ExpiresAt, Epoch: o.Epoch}
	default:
		res.Outcome = OutcomeExpired
	}
	return res
}

// releaseEnded gives back the placement Redis still holds of a request whose
// ledger row o has ended (cancelled, abandoned), when it is the row's own:
// the Redis step that ended it failed (a cancel's, an abandonment's
// release), and the retry answered EXPIRED would otherwise leave the unit
// and the buyer's quota held until the sweeper, after TTL and grace. The
// release is exact: a sweeper releasing the same placement gives it back
// once between them.
func (e *Engine) releaseEnded(ctx context.Context, shard int, key string, o ledger.Order) {
	r, found, err := e.store.GetReservation(ctx, shard, key)
	if err != nil || !found || r.Status != stock.ResReserved || r.User != o.UserID ||
		r.ExpiryMs != o.ExpiresAt.UnixMilli() || r.Epoch != o.Epoch {
		return
	}
	e.release(ctx, shard, key, r.ExpiryMs, r.Epoch)
}

// release gives back the reservation this request placed at expiryMs in epoch
// (and the user's quota on the home shard when it was stolen); another placement
// of the same request, made by a retry since, is not touched. Errors are left to
// the sweeper, which finds the reservation in the expiry index and decides from
// the ledger. A release that ran and lost its reply leaves nothing there, though,
// and the home shard would hold the buyer's quota for the rest of the sale: so a
// stolen reservation is read first, and when its release's answer is lost and it
// is gone, the quota goes back from what was read (exact, so never twice).
func (e *Engine) release(ctx context.Context, shard int, key string, expiryMs, epoch int64) {
	cctx, cancel := detached(ctx)
	defer cancel()
	r, found, err := e.store.GetReservation(cctx, shard, key)
	stolen := err == nil && found && r.Status == stock.ResReserved && r.Home >= 0 && r.Home != shard &&
		r.ExpiryMs == expiryMs && r.Epoch == epoch
	rr, err := e.store.ReleasePlaced(cctx, shard, key, expiryMs, epoch)
	if err == nil {
		err = e.afterRelease(cctx, shard, key, rr)
	}
	if err == nil || !stolen {
		return
	}
	if now, found, err := e.store.GetReservation(cctx, shard, key); err != nil || (found && now.Status != "") {
		return // not released, or cannot tell: the sweeper's
	}
	_, _ = e.store.Quota(cctx, r.Home, stock.QuotaRelease, r.User, key, r.Quantity, shard, r.ExpiryMs)
}

func (e *Engine) afterRelease(ctx context.Context, shard int, key string, rr stock.ReleaseResult) error {
	g, ok := quotaGiveBack(shard, key, rr)
	if !ok {
		return nil
	}
	return e.giveQuota(ctx, rr.Home, g)
}

// giveQuota runs g on the home shard.
func (e *Engine) giveQuota(ctx context.Context, home int, g stock.QuotaGive) error {
	_, err := e.store.Quota(ctx, home, g.Op, g.User, g.Key, g.Quantity, g.Shard, g.ExpiryMs)
	return err
}

// quotaGiveBack is the give-back on its home shard of the quota of a
// reservation of key released on shard, if it was stolen there. Named by
// this shard and the reservation's expiry: a pointer the key has now to
// another placement of the same request keeps its quota.
func quotaGiveBack(shard int, key string, rr stock.ReleaseResult) (stock.QuotaGive, bool) {
	if rr.Code != stock.Released || rr.Home == shard || rr.Home < 0 {
		return stock.QuotaGive{}, false
	}
	return stock.QuotaGive{
		Op: stock.QuotaRelease, User: rr.User, Key: key, Quantity: rr.Quantity, Shard: shard, ExpiryMs: rr.ExpiryMs,
	}, true
}
