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
			row(targetReserve, 2, 13000, 14), row(targetBare, 2, 14000, 11),
			row(targetReserve, 3, 13500, 9), row(targetBare, 3, 15000, 10),
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
	check("reserve / bare handler throughput, 64 buyers", 13000.0/14000*100, true)
	check("reserve p99 latency, 64 buyers", 14, false)
	check("reserve / PostgreSQL hot row, 64 clients", 13000.0/900, true)

	// Medians that meet the target while the rounds' own ratios mostly do not:
	// not met.
	r.Storms = []StormRow{
		row(targetReserve, 1, 13000, 9), row(targetBare, 1, 10000, 9),
		row(targetReserve, 2, 8000, 9), row(targetBare, 2, 10500, 9),
		row(targetReserve, 3, 9000, 9), row(targetBare, 3, 11000, 9),
	}
	got = map[string]Ratio{}
	for _, x := range r.ratios() {
		got[x.Name] = x
	}
	check("reserve / bare handler throughput, 64 buyers", 9000.0/10500*100, false)
}

// The bucket design held against reserve is the N with the best median, and
// the ratio is met only when the rounds' own ratios meet it too.
func TestBucketRatioTakesTheBestN(t *testing.T) {
	row := func(target string, round int, rate float64) StormRow {
		return StormRow{Kind: "reservations", Target: target, Concurrency: 256, Round: round, ReservationsPerSecond: rate}
	}
	r := &Report{Storms: []StormRow{
		row(targetReserve, 1, 20000), row(bucketTarget(10), 1, 5000), row(bucketTarget(64), 1, 7000),
		row(targetReserve, 2, 21000), row(bucketTarget(10), 2, 5200), row(bucketTarget(64), 2, 8000),
		row(targetReserve, 3, 15000), row(bucketTarget(10), 3, 5100), row(bucketTarget(64), 3, 7500),
	}}
	var got *Ratio
	for _, x := range r.ratios() {
		if x.Name == "reserve / PostgreSQL bucket design, 256 buyers" {
			got = &x
		}
	}
	if got == nil {
		t.Fatalf("no bucket ratio in %+v", r.ratios())
	}
	// Medians 20000 / 7500 (64 buckets beat 10); rounds 2.86, 2.63, 2.0.
	if want := 20000.0 / 7500; math.Abs(got.Value-want) > 1e-9 || !got.Met {
		t.Errorf("bucket ratio %+v, want %v met", *got, want)
	}
	// 64 buckets at 7000, 9000, 8000: medians 20000 / 8000 = 2.5x, but the
	// rounds' own ratios are 2.86, 2.33, 1.88.
	r.Storms[5].ReservationsPerSecond = 9000
	r.Storms[8].ReservationsPerSecond = 8000
	for _, x := range r.ratios() {
		if x.Name == "reserve / PostgreSQL bucket design, 256 buyers" && (x.Met || math.Abs(x.Value-2.5) > 1e-9) {
			t.Errorf("want 2.5x not met (rounds 2.86, 2.33, 1.88): %+v", x)
		}
	}
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
