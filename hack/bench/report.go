package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// Report is everything one run measured, printed as markdown or JSON.
type Report struct {
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	Machine Machine   `json:"machine"`
	Servers string    `json:"servers"`
	Load    struct {
		Start Load `json:"start"`
		End   Load `json:"end"`
	} `json:"load"`
	Command         string            `json:"command"`
	Settings        map[string]string `json:"settings"` // every flag, as given or defaulted
	Options         *options          `json:"-"`
	Storms          []StormRow        `json:"storms"`
	HotRow          []HotRowRow       `json:"hot_row"`
	Limits          []LimitRow        `json:"physical_limits,omitempty"`
	GoBenchCommands []string          `json:"go_bench_commands,omitempty"`
	GoBench         []GoBench         `json:"go_bench"`
	Ratios          []Ratio           `json:"ratios"`
	Notes           []string          `json:"notes,omitempty"`
}

// Ratio is one figure held against its target.
type Ratio struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	Target string  `json:"target"`
	Met    bool    `json:"met"`
	Detail string  `json:"detail,omitempty"`
}

func (r *Report) finish() {
	r.Seconds = time.Since(r.Started).Seconds()
	r.Load.End = readLoad()
	r.Ratios = r.ratios()
}

// The kinds of storm.
const (
	kindReservations = "reservations" // every answer a reservation
	kindSoldOut      = "sold-out"     // every answer SOLD_OUT
)

// reservationRows are the reservation storms of a target and concurrency,
// one per round.
func (r *Report) reservationRows(target string, conc int) []StormRow {
	var out []StormRow
	for _, s := range r.Storms {
		if s.Kind == kindReservations && s.Target == target && s.Concurrency == conc {
			out = append(out, s)
		}
	}
	return out
}

// median of f over rows (0 for none).
func median(rows []StormRow, f func(StormRow) float64) float64 {
	vs := make([]float64, len(rows))
	for i, s := range rows {
		vs[i] = f(s)
	}
	return medianOf(vs)
}

// pairedRatio is the median over runs of a[i] / b[i]: each pair ran back to
// back, so a drift of the machine between pairs cancels out.
func pairedRatio(a, b []float64) float64 {
	var vs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			vs = append(vs, a[i]/b[i])
		}
	}
	return medianOf(vs)
}

func medianOf(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	vs = slices.Sorted(slices.Values(vs))
	if n := len(vs); n%2 == 1 {
		return vs[n/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

func rate(s StormRow) float64 { return s.ReservationsPerSecond }

// rates are the rounds' reservation rates, in round order.
func rates(rows []StormRow) []float64 { return stormValues(rows, rate) }

// bestHotRow is the faster hot-row variant at a client count: the ratio is
// taken against the stronger baseline.
func (r *Report) bestHotRow(clients int) (best, other HotRowRow, ok bool) {
	for _, h := range r.HotRow {
		if h.Clients != clients {
			continue
		}
		if !ok || h.TxPerSecond > best.TxPerSecond {
			if ok {
				other = best
			}
			best, ok = h, true
		} else {
			other = h
		}
	}
	return best, other, ok
}

func (r *Report) ratios() []Ratio {
	var out []Ratio
	res64, bare64 := r.reservationRows(targetReserve, 64), r.reservationRows(targetBare, 64)
	out = append(out, r.referenceRatios()...)
	out = append(out, r.openLoopRatios()...)
	if len(res64) > 0 {
		p99 := median(res64, func(s StormRow) float64 { return s.Latency.P99 })
		out = append(out, Ratio{Name: "reserve p99 latency, 64 buyers", Value: p99, Unit: "ms", Target: "<= 10 ms", Met: p99 <= 10,
			Detail: fmt.Sprintf("median of %d rounds; p50 %.2f, p90 %.2f ms; the bare handler's p99 %.2f ms",
				len(res64), median(res64, func(s StormRow) float64 { return s.Latency.P50 }),
				median(res64, func(s StormRow) float64 { return s.Latency.P90 }),
				median(bare64, func(s StormRow) float64 { return s.Latency.P99 }))})
	}
	for _, t := range []struct {
		clients int
		target  float64
	}{{64, 10}, {256, 25}} {
		best, other, ok := r.bestHotRow(t.clients)
		res := r.reservationRows(targetReserve, t.clients)
		if !ok || len(res) == 0 || best.TxPerSecond <= 0 {
			continue
		}
		resRate := median(res, rate)
		v := resRate / best.TxPerSecond
		d := fmt.Sprintf("%.0f reservations/s at %d buyers (median of %d rounds) vs %.0f tx/s (%s) at %d clients", resRate, t.clients, len(res), best.TxPerSecond, best.Variant, t.clients)
		if other.TxPerSecond > 0 {
			d += fmt.Sprintf("; %.1fx the %s variant (%.0f tx/s)", resRate/other.TxPerSecond, other.Variant, other.TxPerSecond)
		}
		out = append(out, Ratio{Name: fmt.Sprintf("reserve / PostgreSQL hot row, %d clients", t.clients), Value: v, Unit: "x",
			Target: fmt.Sprintf(">= %gx", t.target), Met: v >= t.target, Detail: d})
	}
	for _, inFlight := range []int{64, 256} {
		eng, engRuns, ok := r.metric(fmt.Sprintf("BenchmarkReserve/engine/%d", inFlight), "reservations/s")
		raw, rawRuns, okRaw := r.metric(fmt.Sprintf("BenchmarkReserve/raw-script/%d", inFlight), "reservations/s")
		if !ok || !okRaw || raw <= 0 {
			continue
		}
		v, paired := eng/raw, pairedRatio(engRuns, rawRuns)
		out = append(out, Ratio{Name: fmt.Sprintf("engine / raw reserve script, %d in flight (go test -bench)", inFlight), Value: v * 100, Unit: "%",
			Target: ">= 60%", Met: v >= 0.60 && paired >= 0.60,
			Detail: fmt.Sprintf("medians %.0f vs %.0f reservations/s over %d alternating runs each (engine %s; raw %s); median of the runs' own ratios %.1f%%",
				eng, raw, len(engRuns), joinFloats(engRuns), joinFloats(rawRuns), paired*100)})
	}
	if mem, _, ok := r.metric("BenchmarkRedisMemoryPerReservation", "bytes/reservation"); ok {
		out = append(out, Ratio{Name: "Redis memory per outstanding reservation (go test -bench)", Value: mem, Unit: "bytes", Target: "<= 300 bytes", Met: mem <= 300})
	}
	return out
}

func joinFloats(vs []float64) string { return joinDecimals(vs, 0) }

// joinDecimals lists vs with that many decimals, comma-separated.
func joinDecimals(vs []float64, decimals int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprintf("%.*f", decimals, v)
	}
	return strings.Join(s, ", ")
}

func (r *Report) writeMarkdown(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	m := r.Machine
	p("## Run of %s\n\n", r.Started.Format(time.RFC3339))
	p("- command: `%s`\n", r.Command)
	p("- machine: %d CPUs (%s), %.1f GiB memory, Linux %s, %s\n", m.CPUs, m.CPUModel, m.MemoryGB, m.Kernel, m.Go)
	if r.Servers != "" {
		p("- servers: %s, all on 127.0.0.1\n", r.Servers)
	}
	p("- load average (1/5/15 min): %s at start, %s at the end; each row gives the 1-minute load before it ran (the bench's own processes raise it) and the CPU, in cores, that processes other than the bench's used while it ran\n", r.Load.Start, r.Load.End)
	p("- run took %.0f s; reservation storms of %s in %d rounds (sold-out %s) after a %s warm-up each, hot-row runs of %s\n\n",
		r.Seconds, r.Options.Duration, r.Options.Rounds, r.Options.SoldOutDuration, r.Options.Warmup, r.Options.HotRowDuration)

	var res, sold []StormRow
	for _, s := range r.Storms {
		switch s.Kind {
		case kindSoldOut:
			sold = append(sold, s)
		case kindReservations:
			res = append(res, s)
		}
	}
	if len(res) > 0 {
		p("### Reservation storms (every answer a reservation)\n\n")
		p("| round | target | buyers | requests | reservations/s | p50 ms | p90 ms | p99 ms | max ms | CPU µs per request: server / redis / postgres / client | server peak RSS MiB | load | others' CPU | outcomes | ledger audit |\n")
		p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|\n")
		for _, s := range res {
			p("| %d | %s | %d | %d | %.0f | %.2f | %.2f | %.2f | %.2f | %.0f / %.0f / %.0f / %.0f | %.0f | %.2f | %.2f | %s | %s |\n",
				s.Round, targetName(s.Target), s.Concurrency, s.Requests, s.ReservationsPerSecond, s.Latency.P50, s.Latency.P90, s.Latency.P99, s.Latency.Max,
				s.ServerCPUus, s.RedisCPUus, s.PostgresCPUus, s.ClientCPUus, s.ServerPeakRSSMiB, s.LoadBefore[0], s.OthersCores, outcomes(s.Outcomes), audit(s))
		}
		p("\n")
	}
	if len(sold) > 0 {
		p("### Sold-out storms (allocation %d, taken during the warm-up)\n\n", r.Options.SoldOutAllocation)
		p("| target | buyers | requests | answers/s | p50 ms | p90 ms | p99 ms | max ms | CPU µs per request: server / redis / postgres / client | load | others' CPU | outcomes |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|\n")
		for _, s := range sold {
			p("| %s | %d | %d | %.0f | %.2f | %.2f | %.2f | %.2f | %.0f / %.0f / %.0f / %.0f | %.2f | %.2f | %s |\n",
				targetName(s.Target), s.Concurrency, s.Requests, s.RequestsPerSecond, s.Latency.P50, s.Latency.P90, s.Latency.P99, s.Latency.Max,
				s.ServerCPUus, s.RedisCPUus, s.PostgresCPUus, s.ClientCPUus, s.LoadBefore[0], s.OthersCores, outcomes(s.Outcomes))
		}
		p("\n")
	}
	var inside []StormRow
	for _, s := range r.Storms {
		if s.Server != nil {
			inside = append(inside, s)
		}
	}
	if len(inside) > 0 {
		p("### Inside `flashsale reserve` (its /metrics, over each measured storm)\n\n")
		p("| storm | round | buyers | request mean / p99 ms | reserve script mean / p99 ms | script calls per request | ledger batches | rows per batch | batch transaction mean / p99 ms | over 25 ms: requests / script calls / batches |\n")
		p("|---|---:|---:|---|---|---:|---:|---:|---|---|\n")
		for _, s := range inside {
			m := s.Server
			p("| %s | %d | %d | %.2f / %.2f | %.2f / %.2f | %.2f | %.0f | %.1f | %.2f / %.2f | %.0f / %.0f / %.0f |\n", s.Kind, s.Round, s.Concurrency,
				m.RequestMeanMs, m.RequestP99Ms, m.ScriptMeanMs, m.ScriptP99Ms, m.ScriptCallsPerRequest, m.Batches, m.BatchMeanRows,
				m.BatchMeanMs, m.BatchP99Ms, m.SlowRequests, m.SlowScripts, m.SlowBatches)
		}
		p("\n")
	}
	if len(r.HotRow) > 0 {
		p("### PostgreSQL hot row (one inventory row)\n\n")
		p("| statement | clients | tx | tx/s | p50 ms | p90 ms | p99 ms | max ms | errors | load | others' CPU |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, h := range r.HotRow {
			p("| %s | %d | %d | %.0f | %.2f | %.2f | %.2f | %.2f | %d | %.2f | %.2f |\n",
				variantName(h.Variant), h.Clients, h.Tx, h.TxPerSecond, h.Latency.P50, h.Latency.P90, h.Latency.P99, h.Latency.Max, h.Errors, h.LoadBefore[0], h.OthersCores)
		}
		p("\n")
	}
	r.writeOpenLoop(p)
	r.writeLimits(p)
	if len(r.GoBench) > 0 {
		p("### Go benchmarks\n\n")
		for _, c := range r.GoBenchCommands {
			p("- `%s`\n", c)
		}
		p("\n| benchmark | iterations | results |\n|---|---:|---|\n")
		for _, b := range r.GoBench {
			var ms []string
			for _, u := range slices.Sorted(maps.Keys(b.Metrics)) {
				ms = append(ms, fmt.Sprintf("%s %s", trimFloat(b.Metrics[u]), u))
			}
			p("| %s | %d | %s |\n", b.Name, b.Iterations, strings.Join(ms, ", "))
		}
		p("\n")
	}
	if len(r.Ratios) > 0 {
		p("### Against the targets\n\n| figure | value | target | met | detail |\n|---|---:|---|---|---|\n")
		for _, x := range r.Ratios {
			met := "**no**"
			switch {
			case x.Target == "":
				met = "-"
			case x.Met:
				met = "yes"
			}
			val := fmt.Sprintf("%.1f %s", x.Value, x.Unit)
			if x.Unit == "x" {
				val = fmt.Sprintf("%.1fx", x.Value)
			}
			p("| %s | %s | %s | %s | %s |\n", x.Name, val, x.Target, met, x.Detail)
		}
		p("\n")
	}
	for _, n := range r.Notes {
		p("- %s\n", n)
	}
}

func targetName(t string) string {
	switch {
	case t == targetReserve:
		return "`flashsale reserve`"
	case t == targetReserveB:
		return "`flashsale reserve`, second binary (--flashsale-b)"
	case t == targetReserveDirect:
		return "`flashsale reserve`, every reserve call alone (no pipeline)"
	case t == targetBareDirect:
		return "bare handler, every call alone (no pipeline)"
	case strings.HasPrefix(t, targetReservePipe+"-"):
		d, n, _ := pipeOf(t)
		return fmt.Sprintf("`flashsale reserve`, reserve calls pipelined, linger %s, %d in flight", d, n)
	case t == targetDecr:
		return "HTTP + one-command script (DECR)"
	case bucketsOf(t) > 0:
		return fmt.Sprintf("PostgreSQL, %d bucket rows", bucketsOf(t))
	}
	return "bare handler"
}

func variantName(v string) string {
	if v == variantUpdate {
		return "`UPDATE ... WHERE available > 0`"
	}
	return "`SELECT ... FOR UPDATE; UPDATE`"
}

func outcomes(m map[string]int64) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func audit(s StormRow) string {
	switch {
	case s.AuditOK == nil:
		return "-"
	case *s.AuditOK:
		return "ok"
	}
	return "FAILED: " + strings.Join(s.AuditFailures, "; ")
}

func trimFloat(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.2f", v)
}
