package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Code is a stable error code: clients switch on it, so codes are never renamed.
type Code string

// Error codes and the statuses they are sent with (see docs/api.md).
const (
	CodeSoldOut          Code = "SOLD_OUT"           // 410
	CodeNotStarted       Code = "NOT_STARTED"        // 425
	CodeEnded            Code = "ENDED"              // 410
	CodePaused           Code = "PAUSED"             // 503 + Retry-After
	CodeClosed           Code = "CLOSED"             // 503 + Retry-After
	CodeLimitExceeded    Code = "LIMIT_EXCEEDED"     // 409
	CodeRateLimited      Code = "RATE_LIMITED"       // 429 + Retry-After
	CodeAdmissionInvalid Code = "ADMISSION_INVALID"  // 401 bad or expired token, 403 token for another SKU or user
	CodeBadRequest       Code = "BAD_REQUEST"        // 400
	CodeTooLarge         Code = "TOO_LARGE"          // 413
	CodeNotFound         Code = "NOT_FOUND"          // 404
	CodeExpired          Code = "EXPIRED"            // 410
	CodeConflict         Code = "CONFLICT"           // 409: another payment token, cancel after payment, an idempotency key reused with another quantity
	CodeMethodNotAllowed Code = "METHOD_NOT_ALLOWED" // 405
	CodeUnavailable      Code = "UNAVAILABLE"        // 503 + Retry-After
)

// Retry-After values, in seconds. Short: a flash sale is over in minutes, and the
// waiting room in front paces retries anyway.
const (
	retryClosed      = 2
	retryUnavailable = 1
)

// apiError is an answer that is not a success.
type apiError struct {
	status     int
	code       Code
	message    string
	retryAfter int // seconds; 0 = no header
}

// ErrorBody is the JSON body of every error.
type ErrorBody struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func errorf(status int, code Code, message string) *apiError {
	return &apiError{status: status, code: code, message: message}
}

func (e *apiError) retry(seconds int) *apiError {
	e.retryAfter = seconds
	return e
}

func badRequest(message string) *apiError {
	return errorf(http.StatusBadRequest, CodeBadRequest, message)
}

func notFound(message string) *apiError {
	return errorf(http.StatusNotFound, CodeNotFound, message)
}

func unavailable(message string) *apiError {
	return errorf(http.StatusServiceUnavailable, CodeUnavailable, message).retry(retryUnavailable)
}

// write sends the error and returns its code for the metrics.
func (e *apiError) write(w http.ResponseWriter) string {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	if e.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="flashsale", error="invalid_token"`)
	}
	writeJSON(w, e.status, ErrorBody{Code: e.code, Message: e.message})
	return string(e.code)
}

// answerWriteTime is how long writing an answer may take, counted from when the
// handler has it. The server's WriteTimeout counts from the request's headers,
// and a handler may use up its whole budget (the request timeout, then the wait
// for a ledger batch already sent): a reservation made durable by then must
// still reach the client, or the client sees a failure and the unit sits
// reserved until it expires.
const answerWriteTime = 5 * time.Second

// The header values of every answer, set into the map directly: Header.Set
// would canonicalise the key and allocate a slice per answer. Shared and never
// written (a later Header.Add appends to a copy: their capacity is 1).
var (
	headerJSON    = []string{"application/json"}
	headerNoStore = []string{"no-store"}
	headerNoSniff = []string{"nosniff"}
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	// Not every ResponseWriter supports deadlines (tests' recorders); then the
	// server's WriteTimeout alone applies.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(answerWriteTime))
	var b []byte
	var err error
	if r, ok := v.(ReservationBody); ok {
		b, err = r.appendJSON(make([]byte, 0, 128))
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		// Only our own response types get here; they always marshal.
		status, b = http.StatusInternalServerError, []byte(`{"code":"UNAVAILABLE","message":"response encoding failed"}`)
	}
	h := w.Header()
	h["Content-Type"] = headerJSON
	if v := h["Cache-Control"]; len(v) == 0 || v[0] == "" {
		h["Cache-Control"] = headerNoStore
	}
	h["X-Content-Type-Options"] = headerNoSniff
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
