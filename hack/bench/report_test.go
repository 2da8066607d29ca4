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

func TestEngineRatiosPerConcurrency(t *testing.T) {
	out := `pkg: github.com/flashsale-dev/flashsale-operator/runtime/engine
BenchmarkReserve/engine/64-2       100  1 ns/op  15000 reservations/s
BenchmarkReserve/raw-script/64-2   100  1 ns/op  30000 reservations/s
BenchmarkReserve/engine/256-2      100  1 ns/op  20000 reservations/s
BenchmarkReserve/raw-script/256-2  100  1 ns/op  25000 reservations/s
`
	r := &Report{GoBench: parseGoBench(out)}
	got := map[string]Ratio{}
	for _, x := range r.ratios() {
		got[x.Name] = x
	}
	for name, want := range map[string]struct {
		v   float64
		met bool
	}{
		"engine / raw reserve script, 64 in flight (go test -bench)":  {50, false},
		"engine / raw reserve script, 256 in flight (go test -bench)": {80, true},
	} {
		x, ok := got[name]
		if !ok || math.Abs(x.Value-want.v) > 1e-9 || x.Met != want.met {
			t.Errorf("%s: %+v (present %v), want %v met %v", name, x, ok, want.v, want.met)
		}
	}
}
