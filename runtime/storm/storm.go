// Package storm is the load generator behind `flashsale storm`: buyers with
// their own admission tokens reserve against one or more reserve endpoints,
// retry with the same idempotency key, check out, cancel or walk away, and
// the run ends with outcomes, throughput, latency percentiles and an audit of
// the campaign's invariants read from Redis and the ledger.
package storm

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Operations, as reported.
const (
	OpReserve  = "reserve"  // first attempt of a reservation request
	OpRetry    = "retry"    // the same request again (same idempotency key)
	OpCheckout = "checkout" // payment of an acknowledged reservation
	OpCancel   = "cancel"   // the buyer's own cancel
	OpList     = "list"     // the buyer's list of its reservations, after a lost answer
)

// NewClient is an HTTP client for a storm: keep-alive connections, as many as
// there are workers per host (more would only queue at the server), each
// request done on its worker's goroutine (Transport), and a timeout on every
// request so that a dead server costs a bounded wait. Redirects are not
// followed: a reservation is counted only when the URL it was sent to answers,
// and a redirect must not carry buyers' requests to another host.
func NewClient(concurrency int, timeout time.Duration) *http.Client {
	return &http.Client{
		Transport: &Transport{MaxIdlePerHost: concurrency},
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// Progress is a live snapshot.
type Progress struct {
	Elapsed   time.Duration
	Journeys  int64 // finished
	Planned   int64 // Count, or 0 when only the duration bounds the run
	Requests  int64
	Acked     int64 // distinct reservations acknowledged
	Confirmed int64
	Cancelled int64
	SoldOut   int64 // SOLD_OUT answers
	Failed    int64 // transport errors and 5xx answers
	Final     bool
}

// Result is what a storm saw.
type Result struct {
	Started  time.Time
	Elapsed  time.Duration
	Journeys int64
	Requests int64
	// Outcomes counts answers per operation: "201", "200", "410 SOLD_OUT",
	// "ERR refused", ... Every attempt is counted.
	Outcomes map[string]map[string]int64
	// Latency per operation, of every attempt that got an answer.
	Latency map[string]Latency
	// Acked are the reservation ids the buyers were told they hold (201, or 200
	// for a replay), each once, sorted.
	Acked []string
	// Confirmed and Cancelled are the reservation ids whose checkout (200
	// confirmed) or cancel (200 cancelled) was acknowledged.
	Confirmed []string
	Cancelled []string
	// Voided are the reservation ids whose checkout was answered 410 EXPIRED:
	// the buyer was told to void the payment, so the order must not be sold.
	Voided []string
	// Abandoned counts acknowledged reservations the buyer walked away from.
	Abandoned int64
	// IdempotencyViolations are retries of an acknowledged request that did
	// not replay it (I4); each is described.
	IdempotencyViolations []string
	// Recovered counts the lost answers (Config.LoseRatio) whose reservation
	// the buyer found in its list; ListViolations are those its list did
	// not show as answered while it was held, each described.
	Recovered      int64
	ListViolations []string
	// Interrupted: ctx ended the run before its count or duration.
	Interrupted bool
}

// saleVerdicts are the answers only the sale itself gives to a reservation
// request; 400, 401, 403, 404, 429, 503 UNAVAILABLE and transport errors are
// not among them.
var saleVerdicts = map[string]bool{
	"200": true, "201": true, "409 LIMIT_EXCEEDED": true, "410 SOLD_OUT": true, "410 ENDED": true,
	"425 NOT_STARTED": true, "503 PAUSED": true, "503 CLOSED": true,
}

// Verdicts counts the reservation requests the sale decided: reserved,
// replayed, or refused for its stock, state or limit. None means the storm
// never reached the sale (a wrong URL, SKU or admission key).
func (r *Result) Verdicts() int64 {
	var n int64
	for _, op := range []string{OpReserve, OpRetry} {
		for label, c := range r.Outcomes[op] {
			if saleVerdicts[label] {
				n += c
			}
		}
	}
	return n
}

// Throughput is requests per second over the run.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Run storms until Count journeys are done, Duration has passed or ctx is
// cancelled, whichever comes first, and returns what it saw. Journeys in
// flight when it stops are finished (bounded by the request timeout).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	own := cfg.Client == nil
	cfg.defaults()
	if own {
		defer cfg.Client.CloseIdleConnections()
	}
	s := &stormer{cfg: cfg, acked: map[string]bool{}, keyTag: newKeyTag()}
	return s.run(ctx)
}

// newKeyTag is 8 random hex digits, drawn apart from the seed: a storm
// replayed by its seed makes the same choices with new requests.
func newKeyTag() string {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type stormer struct {
	cfg Config
	// keyTag is this storm's own part of every idempotency key: storms that
	// share buyers (one UserPrefix) or a seed are still different requests,
	// and none is answered as a replay of another's.
	keyTag string

	next      atomic.Int64 // next journey number
	journeys  atomic.Int64
	requests  atomic.Int64
	soldOut   atomic.Int64
	failed    atomic.Int64
	confirmed atomic.Int64
	cancelled atomic.Int64
	ackCount  atomic.Int64

	mu    sync.Mutex
	acked map[string]bool
}

// workerStats are one worker's private counters, merged at the end: no
// shared lock on the hot path.
type workerStats struct {
	outcomes       map[string]map[string]int64
	latency        map[string]*histogram
	confirmed      []string
	cancelled      []string
	voided         []string
	abandoned      int64
	violations     []string
	recovered      int64
	listViolations []string
}

func newWorkerStats() *workerStats {
	return &workerStats{outcomes: map[string]map[string]int64{}, latency: map[string]*histogram{}}
}

func (w *workerStats) count(op, outcome string) {
	m := w.outcomes[op]
	if m == nil {
		m = map[string]int64{}
		w.outcomes[op] = m
	}
	m[outcome]++
}

func (w *workerStats) time(op string, d time.Duration) {
	h := w.latency[op]
	if h == nil {
		h = &histogram{}
		w.latency[op] = h
	}
	h.record(d)
}

func (s *stormer) run(parent context.Context) (*Result, error) {
	start := s.cfg.Now()
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var deadline time.Time
	if s.cfg.Duration > 0 {
		deadline = start.Add(s.cfg.Duration)
	}

	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		if s.cfg.Progress == nil {
			return
		}
		t := time.NewTicker(s.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				s.cfg.Progress(s.progress(start, false))
			}
		}
	}()

	stats := make([]*workerStats, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for w := range s.cfg.Concurrency {
		stats[w] = newWorkerStats()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.worker(ctx, start, deadline, stats[w])
		}()
	}
	wg.Wait()
	close(stopProgress)
	<-progressDone

	res := s.result(start, stats)
	res.Interrupted = parent.Err() != nil
	if s.cfg.Progress != nil {
		s.cfg.Progress(s.progress(start, true))
	}
	return res, nil
}

func (s *stormer) progress(start time.Time, final bool) Progress {
	return Progress{
		Elapsed: s.cfg.Now().Sub(start), Journeys: s.journeys.Load(), Planned: int64(s.cfg.Count),
		Requests: s.requests.Load(), Acked: s.ackCount.Load(), Confirmed: s.confirmed.Load(),
		Cancelled: s.cancelled.Load(), SoldOut: s.soldOut.Load(), Failed: s.failed.Load(), Final: final,
	}
}

func (s *stormer) result(start time.Time, stats []*workerStats) *Result {
	res := &Result{
		Started: start, Elapsed: s.cfg.Now().Sub(start), Journeys: s.journeys.Load(), Requests: s.requests.Load(),
		Outcomes: map[string]map[string]int64{}, Latency: map[string]Latency{},
	}
	hists := map[string]*histogram{}
	for _, w := range stats {
		for op, m := range w.outcomes {
			if res.Outcomes[op] == nil {
				res.Outcomes[op] = map[string]int64{}
			}
			for k, v := range m {
				res.Outcomes[op][k] += v
			}
		}
		for op, h := range w.latency {
			if hists[op] == nil {
				hists[op] = &histogram{}
			}
			hists[op].merge(h)
		}
		res.Confirmed = append(res.Confirmed, w.confirmed...)
		res.Cancelled = append(res.Cancelled, w.cancelled...)
		res.Voided = append(res.Voided, w.voided...)
		res.Abandoned += w.abandoned
		res.IdempotencyViolations = append(res.IdempotencyViolations, w.violations...)
		res.Recovered += w.recovered
		res.ListViolations = append(res.ListViolations, w.listViolations...)
	}
	for op, h := range hists {
		res.Latency[op] = h.summary()
	}
	s.mu.Lock()
	for id := range s.acked {
		res.Acked = append(res.Acked, id)
	}
	s.mu.Unlock()
	sort.Strings(res.Acked)
	sort.Strings(res.Confirmed)
	sort.Strings(res.Cancelled)
	sort.Strings(res.Voided)
	return res
}

// ack records a reservation the buyer was told about.
func (s *stormer) ack(id string) {
	s.mu.Lock()
	isNew := !s.acked[id]
	s.acked[id] = true
	s.mu.Unlock()
	if isNew {
		s.ackCount.Add(1)
	}
}

// journey is one buyer's visit: reserve (maybe twice), then pay, cancel or
// walk away.
func (s *stormer) journey(ctx context.Context, j int64, intended time.Time, rng *rand.Rand, st *workerStats) {
	buyer := j % int64(s.cfg.Buyers)
	user := fmt.Sprintf("%s-%d", s.cfg.UserPrefix, buyer)
	key := fmt.Sprintf("%s-%s-j%d", s.cfg.UserPrefix, s.keyTag, j)
	home := int(buyer % int64(len(s.cfg.URLs)))
	token, err := s.cfg.Mint(s.cfg.SKU, user, s.cfg.TokenTTL, s.cfg.Now())
	if err != nil {
		st.count(OpReserve, "ERR token: "+err.Error())
		return
	}
	body := fmt.Sprintf(`{"item_id":%q,"user_id":%q,"quantity":%d,"idempotency_key":%q}`, s.cfg.SKU, user, s.cfg.Quantity, key)
	first := s.callFrom(ctx, st, OpReserve, home, http.MethodPost, reservePath, token, body, intended)
	got := first
	if rng.Float64() < s.cfg.RetryRatio {
		// The next replica, as a client retry through a load balancer could land:
		// the reservation id is derived on the server, so any replica replays it.
		again := s.call(ctx, st, OpRetry, home+1, http.MethodPost, reservePath, token, body)
		if v := replayViolation(first, again); v != "" {
			st.violations = append(st.violations, fmt.Sprintf("user %s key %s: %s", user, key, v))
		}
		if got.reservationID == "" {
			got = again
		}
	}
	if got.reservationID == "" {
		return
	}
	s.ack(got.reservationID)
	r := rng.Float64() // drawn even when stopping, so one seed makes the same choices
	// Drawn only in storms that lose answers, so that the others' seeds
	// make the choices they made before.
	lost := s.cfg.LoseRatio > 0 && rng.Float64() < s.cfg.LoseRatio
	if ctx.Err() != nil {
		st.abandoned++ // the storm is stopping: no new requests
		return
	}
	if lost && !s.findLost(ctx, st, home, token, user, got) {
		st.abandoned++ // not listed: the buyer cannot act on it, and it lapses
		return
	}
	switch {
	case r < s.cfg.CheckoutRatio:
		pay := fmt.Sprintf(`{"reservation_id":%q,"payment_token":%q}`, got.reservationID, "pay-"+key)
		switch a := s.call(ctx, st, OpCheckout, home, http.MethodPost, checkoutPath, token, pay); {
		case a.status == http.StatusOK:
			st.confirmed = append(st.confirmed, got.reservationID)
			s.confirmed.Add(1)
		case a.status == http.StatusGone && a.code == "EXPIRED":
			st.voided = append(st.voided, got.reservationID) // the payment must be voided
		}
	case r < s.cfg.CheckoutRatio+s.cfg.CancelRatio:
		if a := s.call(ctx, st, OpCancel, home, http.MethodDelete, reservationsPath+url.PathEscape(got.reservationID), token, ""); a.status == http.StatusOK {
			st.cancelled = append(st.cancelled, got.reservationID)
			s.cancelled.Add(1)
		}
	default:
		st.abandoned++
	}
}

// clockSlack is how far the storm's clock may be from Redis's, which sets
// expires_at: a retry sent this long before the first answer's expiry finds
// the reservation still held.
const clockSlack = time.Second

// replayViolation says how a retry of an acknowledged reservation request
// broke idempotency (I4), or "". While the reservation is held (the retry's
// answering attempt was sent before it could expire, and this journey has not
// cancelled it), the
// retry must answer 200 with the same reservation: a 201 took another unit,
// and LIMIT_EXCEEDED, SOLD_OUT or EXPIRED means the replay was not recognised.
// A retry that got no verdict (a transport error, 503, 429) or a closed or
// ended sale's answer says nothing either way.
func replayViolation(first, again answer) string {
	if first.reservationID == "" {
		return "" // nothing acknowledged: the retry may reserve
	}
	if again.reservationID != "" && again.reservationID != first.reservationID {
		return fmt.Sprintf("first %s, replay %s", first.reservationID, again.reservationID)
	}
	if first.expiresAt.IsZero() || again.sentAt.IsZero() || !again.sentAt.Add(clockSlack).Before(first.expiresAt) {
		return "" // it may have lapsed: the sweeper may have released it
	}
	switch {
	case again.status == http.StatusCreated:
		return fmt.Sprintf("first %s, replay answered 201: a second reservation", first.reservationID)
	case again.code == "LIMIT_EXCEEDED" || again.code == "SOLD_OUT" || again.code == "EXPIRED" || again.code == "CONFLICT":
		return fmt.Sprintf("first %s (held until %s), replay answered %s", first.reservationID,
			first.expiresAt.UTC().Format(time.RFC3339Nano), outcomeLabel(again.status, again.code))
	}
	return ""
}

// Routes of the reserve API (docs/api.md).
const (
	reservePath      = "/api/v1/flash-sale/reserve"
	checkoutPath     = "/api/v1/flash-sale/checkout"
	reservationsPath = "/api/v1/flash-sale/reservations/"
	heldPath         = "/api/v1/flash-sale/reservations"
)

// outcomeLabel names an answer for the report.
func outcomeLabel(status int, code string) string {
	if code == "" {
		return fmt.Sprint(status)
	}
	return fmt.Sprintf("%d %s", status, code)
}

// transportLabel classifies a transport error without leaking addresses into
// the report's keys.
func transportLabel(err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "Timeout") || strings.Contains(msg, "timeout"):
		return "ERR timeout"
	case strings.Contains(msg, "connection refused"):
		return "ERR refused"
	case strings.Contains(msg, "connection reset"):
		return "ERR reset"
	case strings.Contains(msg, "EOF"):
		return "ERR eof"
	case errors.Is(err, context.Canceled):
		return "ERR cancelled"
	}
	return "ERR other"
}
