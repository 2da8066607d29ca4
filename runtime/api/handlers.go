package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/failpoint"
	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Success bodies.
type (
	// ReservationBody answers a reserve (201, or 200 for a replay).
	ReservationBody struct {
		ReservationID string `json:"reservation_id"`
		ExpiresAt     string `json:"expires_at"` // RFC 3339, UTC, milliseconds
		Status        string `json:"status"`     // "reserved"
	}
	// OrderBody answers a checkout.
	OrderBody struct {
		OrderID string `json:"order_id"`
		Status  string `json:"status"` // "confirmed"
	}
	// StatusBody answers a cancel ("cancelled") and the probes ("ok", "ready").
	StatusBody struct {
		Status string `json:"status"`
	}
	// HeldBody answers the buyer's list of reservations.
	HeldBody struct {
		Reservations []HeldReservation `json:"reservations"`
	}
	// HeldReservation is one reservation the buyer holds: "reserved" until
	// it is paid or released (expires_at, then the sweeper), or "confirmed".
	HeldReservation struct {
		ReservationID string `json:"reservation_id"`
		Quantity      int    `json:"quantity"`
		Status        string `json:"status"`
		ExpiresAt     string `json:"expires_at,omitempty"`
	}
	// AvailabilityBody answers the availability route.
	AvailabilityBody struct {
		ItemID    string `json:"item_id"`
		Available int64  `json:"available"`
		Status    string `json:"status"`
	}
)

// expiryFormat keeps milliseconds: the ledger stores the Redis expiry to the
// millisecond, so a replay answered from the ledger has the same bytes.
const expiryFormat = "2006-01-02T15:04:05.000Z07:00"

// Success codes counted in flashsale_api_requests_total.
const (
	okReserved  = "RESERVED"
	okReplayed  = "REPLAYED"
	okConfirmed = "CONFIRMED"
	okCancelled = "CANCELLED"
	okOK        = "OK"
)

func (s *Server) reserve(w http.ResponseWriter, r *http.Request) string {
	claims, e := s.admit(r)
	if e != nil {
		return e.write(w)
	}
	body, e := s.limitBody(w, r)
	if e != nil {
		return e.write(w)
	}
	req, e := decodeReserve(body, s.engine.Config().MaxPerUser)
	if e != nil {
		return e.write(w)
	}
	if req.ItemID != s.sku {
		return notFound(fmt.Sprintf("item_id %q is not on sale here", clip(req.ItemID))).write(w)
	}
	if req.UserID != claims.Subject {
		return forbidden("the admission token was issued for another user").write(w)
	}
	ctx, e := s.begin(r)
	if e != nil {
		return e.write(w)
	}
	defer s.end()
	res, err := s.engine.Reserve(ctx, req.UserID, req.IdempotencyKey, req.Quantity)
	s.metrics.scriptCalls.Add(float64(res.Calls))
	if err != nil {
		return s.engineError(r, "reserve", err).write(w)
	}
	switch res.Outcome {
	case engine.OutcomeReserved, engine.OutcomeReplayed:
		status, code := http.StatusCreated, okReserved
		if res.Outcome == engine.OutcomeReplayed {
			status, code = http.StatusOK, okReplayed
		} else {
			failpoint.Kill(failpoint.ReserveBefore201)
		}
		writeJSON(w, status, ReservationBody{
			ReservationID: res.Reservation.ID,
			ExpiresAt:     res.Reservation.ExpiresAt.UTC().Format(expiryFormat),
			Status:        "reserved",
		})
		return code
	case engine.OutcomeSoldOut:
		if req.Quantity > 1 {
			// A reservation takes its units from one shard: the last units
			// may be spread over several, each short of the quantity.
			return errorf(http.StatusGone, CodeSoldOut, fmt.Sprintf(
				"sold out: no shard tried holds %d units; fewer may still be reserved", req.Quantity)).write(w)
		}
		return errorf(http.StatusGone, CodeSoldOut, "sold out").write(w)
	case engine.OutcomeLimit:
		return errorf(http.StatusConflict, CodeLimitExceeded,
			fmt.Sprintf("this buyer already holds %d unit(s); at most %d per buyer", res.Held, s.engine.Config().MaxPerUser)).write(w)
	case engine.OutcomeClosed:
		return closedError(res.Reason).write(w)
	case engine.OutcomeBusy:
		return unavailable("this request is still being placed: retry with the same idempotency_key").write(w)
	case engine.OutcomeExpired:
		return errorf(http.StatusGone, CodeExpired,
			"the reservation made with this idempotency_key has expired or was cancelled: use a new idempotency_key").write(w)
	case engine.OutcomeKeyReused:
		return errorf(http.StatusConflict, CodeConflict, fmt.Sprintf(
			"this idempotency_key was used for a reservation of %d unit(s): use a new idempotency_key for another quantity", res.Reservation.Quantity)).write(w)
	}
	return s.engineError(r, "reserve", fmt.Errorf("unknown outcome %q", res.Outcome)).write(w)
}

// closedError maps the reserve script's closed reason to an answer.
func closedError(reason string) *apiError {
	switch reason {
	case stock.StateNotStarted:
		// With a pace: some clients take 425 for a TLS early-data refusal
		// and retry at once.
		return errorf(http.StatusTooEarly, CodeNotStarted, "the sale has not started yet").retry(retryClosed)
	case stock.StatePaused:
		return errorf(http.StatusServiceUnavailable, CodePaused, "the sale is paused").retry(retryClosed)
	case stock.StateEnded:
		return errorf(http.StatusGone, CodeEnded, "the sale has ended")
	}
	// NO_META, FAIL_CLOSED, REBUILDING, STALE_EPOCH, UNVERIFIED: the shards are being
	// (or about to be) rebuilt from the ledger.
	return errorf(http.StatusServiceUnavailable, CodeClosed, "the sale is temporarily closed").retry(retryClosed)
}

func (s *Server) checkout(w http.ResponseWriter, r *http.Request) string {
	claims, e := s.admit(r)
	if e != nil {
		return e.write(w)
	}
	body, e := s.limitBody(w, r)
	if e != nil {
		return e.write(w)
	}
	req, e := decodeCheckout(body)
	if e != nil {
		return e.write(w)
	}
	ctx, e := s.begin(r)
	if e != nil {
		return e.write(w)
	}
	defer s.end()
	res, err := s.engine.Checkout(ctx, claims.Subject, req.ReservationID, req.PaymentToken)
	if err != nil {
		return s.engineError(r, "checkout", err).write(w)
	}
	switch res.Outcome {
	case ledger.CheckoutCommitted, ledger.CheckoutAlreadyCommitted:
		writeJSON(w, http.StatusOK, OrderBody{OrderID: req.ReservationID, Status: "confirmed"})
		return okConfirmed
	case ledger.CheckoutConflict:
		return errorf(http.StatusConflict, CodeConflict, "this reservation was already paid with another payment token: this payment sold nothing and must be voided").write(w)
	case ledger.CheckoutExpired:
		return errorf(http.StatusGone, CodeExpired,
			"the reservation expired or was cancelled before payment: nothing was sold, the payment must be voided").write(w)
	case ledger.CheckoutNotFound:
		return notFound("no such reservation").write(w)
	}
	return s.engineError(r, "checkout", fmt.Errorf("unknown outcome %v", res.Outcome)).write(w)
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) string {
	claims, e := s.admit(r)
	if e != nil {
		return e.write(w)
	}
	id := r.PathValue("reservation_id")
	if len(id) > maxReservationIDLen {
		return notFound("no such reservation").write(w)
	}
	ctx, e := s.begin(r)
	if e != nil {
		return e.write(w)
	}
	defer s.end()
	res, err := s.engine.Cancel(ctx, claims.Subject, id)
	if err != nil {
		return s.engineError(r, "cancel", err).write(w)
	}
	switch res.Outcome {
	case ledger.CancelCancelled, ledger.CancelAlreadyCancelled:
		writeJSON(w, http.StatusOK, StatusBody{Status: "cancelled"})
		return okCancelled
	case ledger.CancelCommitted:
		return errorf(http.StatusConflict, CodeConflict, "this reservation is paid for: it can no longer be cancelled").write(w)
	case ledger.CancelGone:
		return errorf(http.StatusGone, CodeExpired, "this reservation already expired").write(w)
	case ledger.CancelNotFound:
		return notFound("no such reservation").write(w)
	}
	return s.engineError(r, "cancel", fmt.Errorf("unknown outcome %v", res.Outcome)).write(w)
}

// held lists the token subject's reservations in this sale, from the
// ledger: a buyer who lost a reservation's answer and its key can still pay
// for it or cancel it.
func (s *Server) held(w http.ResponseWriter, r *http.Request) string {
	claims, e := s.admit(r)
	if e != nil {
		return e.write(w)
	}
	ctx, e := s.begin(r)
	if e != nil {
		return e.write(w)
	}
	defer s.end()
	orders, err := s.engine.Held(ctx, claims.Subject)
	if err != nil {
		return s.engineError(r, "held", err).write(w)
	}
	body := HeldBody{Reservations: make([]HeldReservation, 0, len(orders))}
	for _, o := range orders {
		h := HeldReservation{ReservationID: o.ReservationID, Quantity: o.Quantity, Status: "reserved"}
		if o.Status == ledger.StatusCommitted {
			h.Status = "confirmed"
		} else {
			h.ExpiresAt = o.ExpiresAt.UTC().Format(expiryFormat)
		}
		body.Reservations = append(body.Reservations, h)
	}
	writeJSON(w, http.StatusOK, body)
	return okOK
}

func (s *Server) availability(w http.ResponseWriter, r *http.Request) string {
	item := r.PathValue("item_id")
	if item != s.sku {
		return notFound(fmt.Sprintf("item %q is not on sale here", clip(item))).write(w)
	}
	ctx := s.deadlines.context()
	snap, err := s.snapshot(ctx)
	if err != nil {
		return s.engineError(r, "availability", err).write(w)
	}
	// The figure is a moment old anyway; let intermediaries share it briefly.
	w.Header().Set("Cache-Control", "public, max-age=1")
	writeJSON(w, http.StatusOK, AvailabilityBody{ItemID: s.sku, Available: max(0, snap.available), Status: snap.status})
	return okOK
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) string {
	writeJSON(w, http.StatusOK, StatusBody{Status: "ok"})
	return okOK
}

// admit checks the admission token, its SKU and the user's rate. It touches
// neither Redis nor the ledger.
func (s *Server) admit(r *http.Request) (admission.Claims, *apiError) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return admission.Claims{}, unauthorized("an admission token is required: Authorization: Bearer <token>")
	}
	now := s.cfg.Now()
	var c admission.Claims
	var err error
	for _, v := range s.verifiers {
		if c, err = v.Parse(strings.TrimSpace(token), now); !errors.Is(err, admission.ErrBadSignature) {
			break
		}
	}
	switch {
	case errors.Is(err, admission.ErrExpired):
		return c, unauthorized("the admission token has expired: get a new one from the waiting room")
	case errors.Is(err, admission.ErrBadSignature):
		return c, unauthorized("the admission token's signature is invalid")
	case err != nil:
		return c, unauthorized("the admission token is malformed")
	case c.SKU != s.sku:
		return c, forbidden("the admission token is for another sale")
	}
	if ok, wait := s.limiter.allow(c.Subject, now); !ok {
		return c, errorf(http.StatusTooManyRequests, CodeRateLimited, "too many requests from this buyer: slow down").
			retry(int(math.Ceil(max(wait, time.Second).Seconds())))
	}
	return c, nil
}

func unauthorized(message string) *apiError {
	return errorf(http.StatusUnauthorized, CodeAdmissionInvalid, message)
}

func forbidden(message string) *apiError {
	return errorf(http.StatusForbidden, CodeAdmissionInvalid, message)
}

// engineError answers a failure of Redis, the ledger or the request's deadline.
// A reserve was not acknowledged: it is retried with the same idempotency_key.
// A checkout or a cancel may have been taken before its answer was lost: it is
// retried too, and a payment is never voided on this answer.
func (s *Server) engineError(r *http.Request, op string, err error) *apiError {
	if errors.Is(err, engine.ErrInvalid) {
		return badRequest(err.Error())
	}
	if r.Context().Err() != nil {
		// The client went away; nobody reads this answer.
		s.log.Debug("client gone", "op", op, "err", err)
	} else if ok, suppressed := s.failureLogs.allow(op, time.Now()); ok {
		s.log.Warn("request failed", "op", op, "err", err, "alikeSuppressed", suppressed)
	}
	retry := "retry"
	switch op {
	case "reserve":
		retry = "retry with the same idempotency_key"
	case "checkout":
		// The ledger may have committed before its answer was lost: a shop
		// that voided the payment on this answer would sell the unit for nothing.
		retry = "the payment may have been recorded: retry with the same payment_token, and void it only on a 409, 410 or 404"
	case "cancel":
		retry = "the cancel may have been taken: retry"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return unavailable("the request timed out: " + retry)
	}
	return unavailable("the reservation service is unavailable: " + retry)
}
