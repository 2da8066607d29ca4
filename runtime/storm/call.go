package storm

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxAnswerBytes bounds what is read of an answer; the API's are tiny.
const maxAnswerBytes = 64 << 10

// Backoff between attempts of one request.
const (
	backoffStep = 25 * time.Millisecond
	backoffMax  = 500 * time.Millisecond
)

// answer is what one request ended with.
type answer struct {
	status        int         // 0 after a transport error
	code          string      // the error body's code
	reservationID string      // reserve and retry: the id of a 201 or 200
	expiresAt     time.Time   // with reservationID: when it lapses unless paid
	held          []heldEntry // a list's 200: the buyer's reservations
	sentAt        time.Time   // when the attempt that gave this answer was sent
	doneAt        time.Time   // when its answer was read (zero without one)
	retryAfter    time.Duration
	// took is the attempt's latency (see latency); timed says it counts in
	// the histogram: an answer, or in the open loop any end of the request.
	took  time.Duration
	timed bool
}

func (a answer) retryable() bool {
	return a.status == 0 || a.status == http.StatusServiceUnavailable || a.status == http.StatusTooManyRequests
}

// Retried reports whether an outcome of Result.Outcomes is an attempt the
// storm retries (a transport error, a 503 or a 429), so that a request's
// final answer is the one after it: the labels' side of answer.retryable.
func Retried(outcome string) bool {
	return strings.HasPrefix(outcome, "ERR") || strings.HasPrefix(outcome, "503") || strings.HasPrefix(outcome, "429")
}

// call sends one request, moving to the next URL after a transport error,
// a 503 or a 429, at most MaxAttempts times. Every attempt is counted.
func (s *stormer) call(ctx context.Context, st *workerStats, op string, urlIndex int, method, path, token, body string) answer {
	return s.callFrom(ctx, st, op, urlIndex, method, path, token, body, time.Time{})
}

// callFrom is call timed from intended (the open loop's due time) when that
// is set. Closed, each answer is timed from its own send. Open, a request
// gives one latency, from its due time to how it ended: its retries' waits
// and a timeout are what its buyer waited, and they count.
func (s *stormer) callFrom(ctx context.Context, st *workerStats, op string, urlIndex int, method, path, token, body string, intended time.Time) answer {
	var a answer
	for attempt := range s.cfg.MaxAttempts {
		base := s.cfg.URLs[(urlIndex+attempt)%len(s.cfg.URLs)]
		a = s.once(ctx, st, op, base, method, path, token, body, intended)
		last := !a.retryable() || attempt == s.cfg.MaxAttempts-1 || ctx.Err() != nil
		if a.timed && (intended.IsZero() || last) {
			st.time(op, a.took)
		}
		if last {
			return a
		}
		wait := backoffStep * time.Duration(attempt+1)
		if a.retryAfter > 0 {
			wait = a.retryAfter
		}
		if s.cfg.Sleep(ctx, min(wait, backoffMax)); ctx.Err() != nil {
			return a
		}
	}
	return a
}

func (s *stormer) once(ctx context.Context, st *workerStats, op, base, method, path, token, body string, intended time.Time) answer {
	// A stopping storm lets requests already sent finish (the client timeout
	// bounds them): cutting them would turn acknowledged reservations into
	// unknown ones and spoil the audit.
	req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), method, strings.TrimRight(base, "/")+path, strings.NewReader(body))
	if err != nil {
		st.count(op, "ERR request")
		s.failed.Add(1)
		return answer{}
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	sentAt := s.cfg.Now()
	resp, err := s.cfg.Client.Do(req)
	s.requests.Add(1)
	if err != nil {
		st.count(op, transportLabel(err))
		s.failed.Add(1)
		return answer{sentAt: sentAt, took: latency(intended, sentAt, s.cfg.Now()), timed: !intended.IsZero()}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswerBytes)) // let the connection be reused
	resp.Body.Close()
	d := latency(intended, sentAt, s.cfg.Now())
	if err != nil {
		st.count(op, "ERR body")
		s.failed.Add(1)
		return answer{sentAt: sentAt, took: d, timed: !intended.IsZero()}
	}
	var wire struct {
		ReservationID string      `json:"reservation_id"`
		ExpiresAt     time.Time   `json:"expires_at"`
		Code          string      `json:"code"`
		Reservations  []heldEntry `json:"reservations"`
	}
	_ = json.Unmarshal(b, &wire) // a body that is not ours shows as a bare status
	a := answer{status: resp.StatusCode, code: wire.Code, sentAt: sentAt, doneAt: s.cfg.Now(), took: d, timed: true}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		a.retryAfter = time.Duration(secs) * time.Second
	}
	if (op == OpReserve || op == OpRetry) && (a.status == http.StatusCreated || a.status == http.StatusOK) {
		a.reservationID, a.expiresAt = wire.ReservationID, wire.ExpiresAt
	}
	if op == OpList && a.status == http.StatusOK {
		a.held = wire.Reservations
	}
	st.count(op, outcomeLabel(a.status, a.code))
	if a.code == "SOLD_OUT" {
		s.soldOut.Add(1)
	}
	if a.status >= 500 {
		s.failed.Add(1)
	}
	return a
}
