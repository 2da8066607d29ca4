package storm

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// LatencyMS is a latency summary in milliseconds, for reports.
type LatencyMS struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
}

// Report is the final report, as printed and as --json.
type Report struct {
	URLs        []string `json:"urls"`
	SKU         string   `json:"sku"`
	Buyers      int      `json:"buyers"`
	Concurrency int      `json:"concurrency"`
	// Rate is the open loop's schedule in journeys per second (0: closed
	// loop); its latencies count from each journey's due time.
	Rate float64 `json:"rate,omitempty"`

	ElapsedSeconds        float64                     `json:"elapsed_seconds"`
	Journeys              int64                       `json:"journeys"`
	Requests              int64                       `json:"requests"`
	RequestsPerSecond     float64                     `json:"requests_per_second"`
	ReservationsPerSecond float64                     `json:"reservations_per_second"` // acknowledged
	Outcomes              map[string]map[string]int64 `json:"outcomes"`
	LatencyMS             map[string]LatencyMS        `json:"latency_ms"`

	Acked                 int      `json:"acked"`
	Confirmed             int      `json:"confirmed"`
	Cancelled             int      `json:"cancelled"`
	Abandoned             int64    `json:"abandoned"`
	IdempotencyViolations []string `json:"idempotency_violations"`
	// Recovered lost answers, and the lists that did not show one as
	// answered (Config.LoseRatio).
	Recovered      int64    `json:"recovered,omitempty"`
	ListViolations []string `json:"list_violations"`

	Audit *Audit `json:"audit,omitempty"` // nil when the audit was not run
	// Failures of the run itself: it was interrupted, or no request reached
	// the sale.
	Failures []string `json:"failures"`
	// OK: the run was complete and reached the sale, the audit passed (or
	// was not run) and no replay broke idempotency.
	OK bool `json:"ok"`
}

// NewReport summarises a storm and its audit (which may be nil).
func NewReport(cfg Config, res *Result, audit *Audit) *Report {
	r := &Report{
		URLs: cfg.URLs, SKU: cfg.SKU, Buyers: cfg.Buyers, Concurrency: cfg.Concurrency, Rate: cfg.Rate,
		ElapsedSeconds: res.Elapsed.Seconds(), Journeys: res.Journeys, Requests: res.Requests,
		RequestsPerSecond: res.Throughput(), Outcomes: res.Outcomes, LatencyMS: map[string]LatencyMS{},
		Acked: len(res.Acked), Confirmed: len(res.Confirmed), Cancelled: len(res.Cancelled), Abandoned: res.Abandoned,
		IdempotencyViolations: res.IdempotencyViolations, Audit: audit,
		Recovered: res.Recovered, ListViolations: res.ListViolations,
	}
	if r.IdempotencyViolations == nil {
		r.IdempotencyViolations = []string{}
	}
	if r.ListViolations == nil {
		r.ListViolations = []string{}
	}
	if res.Elapsed > 0 {
		r.ReservationsPerSecond = float64(len(res.Acked)) / res.Elapsed.Seconds()
	}
	for op, l := range res.Latency {
		r.LatencyMS[op] = LatencyMS{Count: l.Count, P50: ms(l.P50), P90: ms(l.P90), P99: ms(l.P99), P999: ms(l.P999), Max: ms(l.Max)}
	}
	if r.Concurrency <= 0 {
		r.Concurrency = DefaultConcurrency
	}
	r.Failures = []string{}
	if res.Interrupted {
		r.Failures = append(r.Failures, "interrupted: the storm did not run its planned count or duration")
	}
	if res.Journeys > 0 && res.Verdicts() == 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("no reservation request reached the sale (outcomes %v): check the URL, the SKU and the admission key", res.Outcomes[OpReserve]))
	}
	r.OK = len(r.Failures) == 0 && len(res.IdempotencyViolations) == 0 && len(res.ListViolations) == 0 && (audit == nil || audit.OK)
	return r
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// opOrder is the order operations are listed in.
var opOrder = []string{OpReserve, OpRetry, OpList, OpCheckout, OpCancel}

func sortedOps[V any](m map[string]V) []string {
	var ops []string
	for _, op := range opOrder {
		if _, ok := m[op]; ok {
			ops = append(ops, op)
		}
	}
	return ops
}

// WriteText prints the report for people.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "storm: %d journeys, %d requests in %.2fs: %.0f req/s; %d reservations acknowledged (%.0f/s)\n",
		r.Journeys, r.Requests, r.ElapsedSeconds, r.RequestsPerSecond, r.Acked, r.ReservationsPerSecond)
	fmt.Fprintf(&b, "buyers: %d confirmed, %d cancelled, %d abandoned\n", r.Confirmed, r.Cancelled, r.Abandoned)
	if n := r.Outcomes[OpList]["200"]; n > 0 || len(r.ListViolations) > 0 {
		fmt.Fprintf(&b, "lost answers: %d found in the buyer's list (%d lists answered)\n", r.Recovered, n)
	}

	tw := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "\noutcomes:")
	for _, op := range sortedOps(r.Outcomes) {
		labels := make([]string, 0, len(r.Outcomes[op]))
		for l := range r.Outcomes[op] {
			labels = append(labels, l)
		}
		sort.Strings(labels)
		for i, l := range labels {
			name := op
			if i > 0 {
				name = ""
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\n", name, l, r.Outcomes[op][l])
		}
	}
	if r.Rate > 0 {
		fmt.Fprintf(tw, "\nopen loop at %.0f journeys/s: reserve latencies count from each journey's due time\n", r.Rate)
	}
	fmt.Fprintln(tw, "\nlatency (ms):\tcount\tp50\tp90\tp99\tp99.9\tmax")
	for _, op := range sortedOps(r.LatencyMS) {
		l := r.LatencyMS[op]
		fmt.Fprintf(tw, "  %s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\n", op, l.Count, l.P50, l.P90, l.P99, l.P999, l.Max)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, v := range r.IdempotencyViolations {
		fmt.Fprintf(&b, "idempotency violation: %s\n", v)
	}
	for _, v := range r.ListViolations {
		fmt.Fprintf(&b, "list violation: %s\n", v)
	}
	for _, f := range r.Failures {
		fmt.Fprintf(&b, "FAIL %s\n", f)
	}
	if a := r.Audit; a != nil {
		fmt.Fprintf(&b, "\naudit: allocation %d, available %d + reserved %d + sold %d = %d (%s); oversold %d; ledger pending %d\n",
			a.Allocation, a.Available, a.Reserved, a.Sold, a.Available+a.Reserved+a.Sold, conserved(a.Conserved), a.Oversold, a.Pending)
		if a.SettleAsked {
			state := "settled"
			if !a.Settled {
				state = "NOT settled"
			}
			fmt.Fprintf(&b, "       %s after %.1fs\n", state, a.SettleSeconds)
		}
		fmt.Fprintf(&b, "       ledger: %d/%d acknowledged reservations, %d/%d confirmed checkouts committed, %d/%d cancels recorded\n",
			a.AckedInLedger, a.Acked, a.ConfirmedCommitted, a.Confirmed, a.CancelledByUser, a.Cancelled)
		for _, f := range a.Failures {
			fmt.Fprintf(&b, "FAIL %s\n", f)
		}
	} else {
		fmt.Fprintln(&b, "\naudit: not run")
	}
	if r.OK {
		fmt.Fprintln(&b, "OK")
	} else {
		fmt.Fprintln(&b, "FAILED")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func conserved(ok bool) string {
	if ok {
		return "conserved"
	}
	return "NOT conserved"
}

// FormatProgress is one progress line.
func FormatProgress(p Progress) string {
	rate := 0.0
	if p.Elapsed > 0 {
		rate = float64(p.Requests) / p.Elapsed.Seconds()
	}
	done := fmt.Sprint(p.Journeys)
	if p.Planned > 0 {
		done = fmt.Sprintf("%d/%d", p.Journeys, p.Planned)
	}
	return fmt.Sprintf("%6.1fs  journeys %s  requests %d (%.0f/s)  reserved %d  paid %d  cancelled %d  sold-out %d  failed %d",
		p.Elapsed.Seconds(), done, p.Requests, rate, p.Acked, p.Confirmed, p.Cancelled, p.SoldOut, p.Failed)
}
