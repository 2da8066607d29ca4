package main

import (
	"context"
	"fmt"
)

// kindOpenLoop are the storms on a fixed schedule (storm.Config.Rate): the
// closed loop's latencies hide the queue a slow answer builds (coordinated
// omission); these count from each request's due time, as wrk2 does.
const kindOpenLoop = "open-loop"

// openLoopConns is the connections of the open-loop storms.
const openLoopConns = 64

// openLoop runs each target of the reservation storms at each --open-loop
// fraction of its own closed-loop maximum at 64 buyers (the median of the
// rounds), on 64 connections, the targets taking turns. Every variant of the
// product (a second binary, a pipeline and its linger) runs on the schedule
// of the product itself, so their tails are compared at the same load.
func (e *benchEnv) openLoop(ctx context.Context, camps map[string]*campaign) error {
	for _, frac := range e.o.OpenLoop {
		for _, t := range e.o.openLoopTargets() {
			base := t
			if isReserve(t) && len(e.rep.reservationRows(targetReserve, openLoopConns)) > 0 {
				base = targetReserve
			}
			closed := e.rep.reservationRows(base, openLoopConns)
			if len(closed) == 0 {
				continue
			}
			rate := frac * median(closed, rate)
			if rate < 1 {
				continue
			}
			row, err := e.storm(ctx, kindOpenLoop, t, camps[t], openLoopConns, 0, e.o.Duration, rate)
			if err != nil {
				return err
			}
			row.Note = fmt.Sprintf("%.0f%% of the closed-loop maximum", frac*100)
			e.rep.Storms = append(e.rep.Storms, row)
		}
	}
	return nil
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

// openLoopRatios: reserve's p99 on the schedule at each fraction (<= 10 ms at 50%).
func (r *Report) openLoopRatios() []Ratio {
	var out []Ratio
	for _, s := range r.Storms {
		if s.Kind != kindOpenLoop || s.Target != targetReserve {
			continue
		}
		x := Ratio{Name: fmt.Sprintf("reserve open-loop p99, %s (%.0f/s, %d connections)", s.Note, s.Rate, s.Concurrency),
			Value: s.Latency.P99, Unit: "ms",
			Detail: fmt.Sprintf("p50 %.2f, p99.9 %.2f, max %.2f ms; %.0f reservations/s answered", s.Latency.P50, s.Latency.P999, s.Latency.Max, s.ReservationsPerSecond)}
		if s.Note == "50% of the closed-loop maximum" {
			x.Target, x.Met = "<= 10 ms", s.Latency.P99 <= 10
		}
		out = append(out, x)
	}
	return out
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
	p("| target | schedule | rate /s | answered /s | p50 ms | p99 ms | p99.9 ms | max ms | CPU µs per request: server / redis / postgres / client | load | outcomes |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|\n")
	for _, s := range rows {
		p("| %s | %s | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f | %.0f / %.0f / %.0f / %.0f | %.2f | %s |\n",
			targetName(s.Target), s.Note, s.Rate, s.RequestsPerSecond, s.Latency.P50, s.Latency.P99, s.Latency.P999, s.Latency.Max,
			s.ServerCPUus, s.RedisCPUus, s.PostgresCPUus, s.ClientCPUus, s.LoadBefore[0], outcomes(s.Outcomes))
	}
	p("\n")
}
