package main

import (
	"math"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
)

// The ratios come from the medians of the rounds, so one slow round of either
// target does not decide them.
func TestRatiosUseMediansOfRounds(t *testing.T) {
	row := func(target string, round int, rate, p99 float64) StormRow {
		return StormRow{Kind: "reservations", Target: target, Concurrency: 64, Round: round, ReservationsPerSecond: rate,
			Latency: storm.LatencyMS{P99: p99}}
	}
	r := &Report{
		Storms: []StormRow{
			row(targetReserve, 1, 6000, 30), row(targetBare, 1, 12000, 12),
			row(targetReserve, 2, 9000, 14), row(targetBare, 2, 14000, 11),
			row(targetReserve, 3, 9500, 9), row(targetBare, 3, 15000, 10),
		},
		HotRow: []HotRowRow{{Variant: "update", Clients: 64, TxPerSecond: 900}, {Variant: "for-update", Clients: 64, TxPerSecond: 500}},
	}
	got := map[string]Ratio{}
	for _, x := range r.ratios() {
		got[x.Name] = x
	}
	check := func(name string, want float64, met bool) {
		t.Helper()
		x, ok := got[name]
		if !ok {
			t.Fatalf("no ratio %q in %v", name, got)
		}
		if math.Abs(x.Value-want) > 1e-9 || x.Met != met {
			t.Errorf("%s = %v (met %v), want %v (met %v)", name, x.Value, x.Met, want, met)
		}
	}
	check("reserve / bare handler throughput, 64 buyers", 9000.0/14000*100, true)
	check("reserve p99 latency, 64 buyers", 14, false)
	check("reserve / PostgreSQL hot row, 64 clients", 10, true)

	// Medians that meet the target while the rounds' own ratios mostly do not:
	// not met.
	r.Storms = []StormRow{
		row(targetReserve, 1, 9000, 9), row(targetBare, 1, 10000, 9),
		row(targetReserve, 2, 6000, 9), row(targetBare, 2, 11000, 9),
		row(targetReserve, 3, 6600, 9), row(targetBare, 3, 11500, 9),
	}
	got = map[string]Ratio{}
	for _, x := range r.ratios() {
		got[x.Name] = x
	}
	check("reserve / bare handler throughput, 64 buyers", 6600.0/11000*100, false)
}
