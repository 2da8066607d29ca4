package main

import (
	"fmt"
	"strings"
)

// referenceRatios hold reserve against the bare handler, the one-command
// script and the best PostgreSQL bucket design, at every concurrency: the
// medians over rounds and the median of each round's own ratio (the targets
// of a round ran back to back).
func (r *Report) referenceRatios() []Ratio {
	var out []Ratio
	for _, conc := range r.concurrencies() {
		res := r.reservationRows(targetReserve, conc)
		if len(res) == 0 {
			continue
		}
		resRate := median(res, rate)
		out = append(out, r.variantRatios(conc, res)...)
		if bare := r.reservationRows(targetBare, conc); len(bare) > 0 {
			b := median(bare, rate)
			med, paired := resRate/b, pairedRatio(rates(res), rates(bare))
			out = append(out, Ratio{Name: fmt.Sprintf("reserve / bare handler throughput, %d buyers", conc), Value: med * 100, Unit: "%",
				Target: ">= 85%", Met: med >= 0.85 && paired >= 0.85,
				Detail: fmt.Sprintf("medians %.0f vs %.0f reservations/s over %d rounds (reserve %s; bare %s); median of the rounds' own ratios %.1f%%",
					resRate, b, len(res), joinFloats(rates(res)), joinFloats(rates(bare)), paired*100)})
		}
		if decr := r.reservationRows(targetDecr, conc); len(decr) > 0 {
			d := median(decr, rate)
			out = append(out, Ratio{Name: fmt.Sprintf("reserve / HTTP + one-command script, %d buyers", conc), Value: resRate / d * 100, Unit: "%",
				Detail: fmt.Sprintf("medians %.0f vs %.0f reservations/s (DECR %s); median of the rounds' own ratios %.1f%%; the DECR reference's CPU µs per request server / redis / client %.0f / %.0f / %.0f",
					resRate, d, joinFloats(rates(decr)), pairedRatio(rates(res), rates(decr))*100,
					median(decr, func(s StormRow) float64 { return s.ServerCPUus }), median(decr, func(s StormRow) float64 { return s.RedisCPUus }),
					median(decr, func(s StormRow) float64 { return s.ClientCPUus }))})
		}
		if best, rows, others := r.bestBuckets(conc); best != "" {
			b := median(rows, rate)
			med, paired := resRate/b, pairedRatio(rates(res), rates(rows))
			d := fmt.Sprintf("%.0f vs %.0f reservations/s, the best bucket design %s (%s), p99 %.2f ms, CPU µs per request server / postgres / client %.0f / %.0f / %.0f; median of the rounds' own ratios %.2fx",
				resRate, b, targetName(best), joinFloats(rates(rows)), median(rows, func(s StormRow) float64 { return s.Latency.P99 }),
				median(rows, func(s StormRow) float64 { return s.ServerCPUus }), median(rows, func(s StormRow) float64 { return s.PostgresCPUus }),
				median(rows, func(s StormRow) float64 { return s.ClientCPUus }), paired)
			if others != "" {
				d += "; " + others
			}
			out = append(out, Ratio{Name: fmt.Sprintf("reserve / PostgreSQL bucket design, %d buyers", conc), Value: med, Unit: "x",
				Target: ">= 2.5x", Met: med >= 2.5 && paired >= 2.5, Detail: d})
		}
	}
	return out
}

// variantRatios hold each variant of the product (a second binary, a
// pipeline with its linger) against the product as it ships, at conc:
// throughput and CPU per reservation, medians and paired (the variant and
// the product ran back to back in every round).
func (r *Report) variantRatios(conc int, res []StormRow) []Ratio {
	var names []string
	for _, s := range r.Storms {
		if s.Kind == kindReservations && s.Concurrency == conc && isReserve(s.Target) && s.Target != targetReserve && !contains(names, s.Target) {
			names = append(names, s.Target)
		}
	}
	server := func(s StormRow) float64 { return s.ServerCPUus }
	redisCPU := func(s StormRow) float64 { return s.RedisCPUus }
	p99 := func(s StormRow) float64 { return s.Latency.P99 }
	out := make([]Ratio, 0, len(names))
	for _, t := range names {
		v := r.reservationRows(t, conc)
		out = append(out, Ratio{Name: fmt.Sprintf("%s / `flashsale reserve` throughput, %d buyers", targetName(t), conc),
			Value: median(v, rate) / median(res, rate) * 100, Unit: "%",
			Detail: fmt.Sprintf("rounds %s vs %s reservations/s; paired %.1f%%; server CPU µs per reservation %s vs %s (paired %.3f); Redis %s vs %s (paired %.3f); p99 ms %s vs %s",
				joinFloats(rates(v)), joinFloats(rates(res)), pairedRatio(rates(v), rates(res))*100,
				joinFloats(stormValues(v, server)), joinFloats(stormValues(res, server)), pairedRatio(stormValues(v, server), stormValues(res, server)),
				joinFloats(stormValues(v, redisCPU)), joinFloats(stormValues(res, redisCPU)), pairedRatio(stormValues(v, redisCPU), stormValues(res, redisCPU)),
				joinDecimals(stormValues(v, p99), 1), joinDecimals(stormValues(res, p99), 1))})
	}
	return out
}

// concurrencies are the reservation storms' buyer counts, in run order.
func (r *Report) concurrencies() []int {
	var out []int
	seen := map[int]bool{}
	for _, s := range r.Storms {
		if s.Kind == kindReservations && !seen[s.Concurrency] {
			seen[s.Concurrency] = true
			out = append(out, s.Concurrency)
		}
	}
	return out
}

// bestBuckets is the bucket target with the highest median rate at conc,
// its rows, and the others' medians.
func (r *Report) bestBuckets(conc int) (best string, rows []StormRow, others string) {
	var bestRate float64
	var names []string
	for _, s := range r.Storms {
		if s.Kind == kindReservations && s.Concurrency == conc && bucketsOf(s.Target) > 0 && !contains(names, s.Target) {
			names = append(names, s.Target)
		}
	}
	all := make([]string, 0, len(names))
	for _, t := range names {
		rs := r.reservationRows(t, conc)
		m := median(rs, rate)
		all = append(all, fmt.Sprintf("%s %.0f/s", targetName(t), m))
		if best == "" || m > bestRate {
			best, rows, bestRate = t, rs, m
		}
	}
	if len(all) > 1 {
		others = "medians: " + strings.Join(all, ", ")
	}
	return best, rows, others
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func (r *Report) writeLimits(p func(string, ...any)) {
	if len(r.Limits) == 0 {
		return
	}
	o := r.Options.Limits
	p("### Physical limits (redis-benchmark, %d connections, %d calls a run; COPY in batches of %d rows)\n\n", o.Clients, o.Calls, o.CopyBatch)
	p("| run | round | calls or rows | per second | server CPU µs per call (redis-server or PostgreSQL) | in-command µs per call | Redis bytes per call | load |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, l := range r.Limits {
		in, mem := "-", "-"
		if l.InCommandUs > 0 {
			in = fmt.Sprintf("%.1f", l.InCommandUs)
		}
		if l.BytesPerCall != 0 {
			mem = fmt.Sprintf("%.0f", l.BytesPerCall)
		}
		p("| %s | %d | %d | %.0f | %.1f | %s | %s | %.2f |\n", l.Name, l.Round, l.Calls, l.PerSecond, l.ServerCPUus, in, mem, l.LoadBefore[0])
	}
	p("\n")
}
