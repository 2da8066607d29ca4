package main

import (
	"context"
	"fmt"
	"slices"
)

// kindOpenLoop are the storms on a fixed schedule (storm.Config.Rate): the
// closed loop's latencies hide the queue a slow answer builds (coordinated
// omission); these count from each request's due time, as wrk2 does.
const kindOpenLoop = "open-loop"

// openLoopConns is the connections of the open-loop storms.
const openLoopConns = 64

// openLoop runs each target of the reservation storms at each --open-loop
// fraction of its own closed-loop maximum at 64 buyers (the median of the
// rounds), on 64 connections, --open-loop-rounds times, the targets taking
// turns as in the closed loop. Every variant of the product (a second
// binary, a pipeline and its linger) runs on the schedule of the product
// itself, so their tails are compared at the same load.
func (e *benchEnv) openLoop(ctx context.Context, camps map[string]*campaign) error {
	for round := 1; round <= e.o.OpenLoopRounds; round++ {
		for _, frac := range e.o.OpenLoop {
			for _, t := range turnOrder(e.o.openLoopTargets(), round) {
				rate := e.rep.openLoopRate(t, frac)
				if rate < 1 {
					continue
				}
				row, err := e.storm(ctx, kindOpenLoop, t, camps[t], openLoopConns, round, e.o.Duration, rate)
				if err != nil {
					return err
				}
				row.Note = scheduleNote(frac)
				e.rep.Storms = append(e.rep.Storms, row)
			}
		}
	}
	return nil
}

// openLoopRate is target's schedule at frac: frac of the median closed-loop
// rate at 64 buyers of the target, or of the product for its variants; 0
// when that was not measured.
func (r *Report) openLoopRate(target string, frac float64) float64 {
	base := target
	if isReserve(target) && len(r.reservationRows(targetReserve, openLoopConns)) > 0 {
		base = targetReserve
	}
	closed := r.reservationRows(base, openLoopConns)
	if len(closed) == 0 {
		return 0
	}
	return frac * median(closed, rate)
}

// scheduleNote names an open-loop storm's schedule.
func scheduleNote(frac float64) string {
	return fmt.Sprintf("%.0f%% of the closed-loop maximum", frac*100)
}

// openLoopTargets: the product, its variants and its bare handler (the
// references' latency under a schedule is not what the targets ask).
func (o *options) openLoopTargets() []string {
	var out []string
	for _, t := range o.targets() {
		if isReserve(t) || t == targetBare || t == targetBareDirect {
			out = append(out, t)
		}
	}
	return out
}

// keptUp is the least share of its schedule an open-loop storm answers (in
// requests per second of its whole run, the drain included) to count as
// having kept up with it.
const keptUp = 0.98

// fellBehind: the storm answered less than its schedule asked. The machine
// could not keep up for a while and a backlog built up, so its p99 measures
// that backlog more than the target.
func fellBehind(s StormRow) bool {
	return s.Kind == kindOpenLoop && s.RequestsPerSecond < keptUp*s.Rate
}

// behindNote says how many of rows fell behind their schedule ("" for none).
func behindNote(rows []StormRow) string {
	n := 0
	for _, s := range rows {
		if fellBehind(s) {
			n++
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d of %d rounds fell behind the schedule (answered below %.0f%% of it): their p99 is the backlog", n, len(rows), keptUp*100)
}

// openLoopRows are the open-loop storms of a target on one schedule, one per
// round.
func (r *Report) openLoopRows(target, note string) []StormRow {
	var out []StormRow
	for _, s := range r.Storms {
		if s.Kind == kindOpenLoop && s.Target == target && s.Note == note {
			out = append(out, s)
		}
	}
	return out
}

// openLoopRatios: per schedule, reserve's p99 (the median of the rounds; <=
// 10 ms at 50%), and each variant's p99 against reserve's, medians and
// paired (they ran back to back in every round).
func (r *Report) openLoopRatios() []Ratio {
	var notes, variants []string
	for _, s := range r.Storms {
		if s.Kind != kindOpenLoop {
			continue
		}
		if !slices.Contains(notes, s.Note) {
			notes = append(notes, s.Note)
		}
		if isReserve(s.Target) && s.Target != targetReserve && !slices.Contains(variants, s.Target) {
			variants = append(variants, s.Target)
		}
	}
	p99 := func(s StormRow) float64 { return s.Latency.P99 }
	var out []Ratio
	for _, note := range notes {
		res := r.openLoopRows(targetReserve, note)
		if len(res) == 0 {
			continue
		}
		x := Ratio{Name: fmt.Sprintf("reserve open-loop p99, %s (%.0f/s, %d connections)", note, res[0].Rate, res[0].Concurrency),
			Value: median(res, p99), Unit: "ms",
			Detail: fmt.Sprintf("median of %d rounds (%s ms); medians: p50 %.2f, p99.9 %.2f, max %.2f ms, %.0f reservations/s answered",
				len(res), joinDecimals(stormValues(res, p99), 2), median(res, func(s StormRow) float64 { return s.Latency.P50 }),
				median(res, func(s StormRow) float64 { return s.Latency.P999 }), median(res, func(s StormRow) float64 { return s.Latency.Max }),
				median(res, rate)) + behindNote(res) + insideNote(res)}
		if bare := r.openLoopRows(targetBare, note); len(bare) > 0 {
			x.Detail += fmt.Sprintf("; the bare handler on its own schedule (%.0f/s): p99 %.2f ms", bare[0].Rate, median(bare, p99))
		}
		if note == scheduleNote(0.5) {
			x.Target, x.Met = "<= 10 ms", x.Value <= 10
		}
		out = append(out, x)
		for _, t := range variants {
			v := r.openLoopRows(t, note)
			if len(v) == 0 {
				continue
			}
			out = append(out, Ratio{Name: fmt.Sprintf("%s / `flashsale reserve` open-loop p99, %s", targetName(t), note),
				Value: median(v, p99) / median(res, p99) * 100, Unit: "%",
				Detail: fmt.Sprintf("rounds %s vs %s ms; paired %.1f%%",
					joinDecimals(stormValues(v, p99), 2), joinDecimals(stormValues(res, p99), 2), pairedRatio(stormValues(v, p99), stormValues(res, p99))*100) +
					behindNote(v)})
		}
	}
	return out
}

// insideNote places the storms' tail: the medians of the reserve process's
// own p99s (request, script call, ledger batch) beside the client's.
func insideNote(rows []StormRow) string {
	var in []StormRow
	for _, s := range rows {
		if s.Server != nil {
			in = append(in, s)
		}
	}
	if len(in) == 0 {
		return ""
	}
	return fmt.Sprintf("; inside the process (its histograms, medians): request p99 %.2f, reserve script p99 %.2f, ledger batch p99 %.2f ms",
		median(in, func(s StormRow) float64 { return s.Server.RequestP99Ms }),
		median(in, func(s StormRow) float64 { return s.Server.ScriptP99Ms }),
		median(in, func(s StormRow) float64 { return s.Server.BatchP99Ms }))
}

// stormValues is f of each row, in row order.
func stormValues(rows []StormRow, f func(StormRow) float64) []float64 {
	vs := make([]float64, len(rows))
	for i, s := range rows {
		vs[i] = f(s)
	}
	return vs
}

func (r *Report) writeOpenLoop(p func(string, ...any)) {
	var rows []StormRow
	for _, s := range r.Storms {
		if s.Kind == kindOpenLoop {
			rows = append(rows, s)
		}
	}
	if len(rows) == 0 {
		return
	}
	p("### Open loop (requests on a fixed schedule, latency from each one's due time; %d connections)\n\n", openLoopConns)
	p("| round | target | schedule | rate /s | answered /s | p50 ms | p99 ms | p99.9 ms | max ms | CPU µs per request: server / redis / postgres / client | load | outcomes |\n")
	p("|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|\n")
	for _, s := range rows {
		answered := fmt.Sprintf("%.0f", s.RequestsPerSecond)
		if fellBehind(s) {
			answered += ", behind"
		}
		p("| %d | %s | %s | %.0f | %s | %.2f | %.2f | %.2f | %.2f | %.0f / %.0f / %.0f / %.0f | %.2f | %s |\n",
			s.Round, targetName(s.Target), s.Note, s.Rate, answered, s.Latency.P50, s.Latency.P99, s.Latency.P999, s.Latency.Max,
			s.ServerCPUus, s.RedisCPUus, s.PostgresCPUus, s.ClientCPUus, s.LoadBefore[0], outcomes(s.Outcomes))
	}
	p("\n")
}
