package main

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
)

// Targets take turns: every other round runs them in reverse, and the
// caller's list is left as it was.
func TestTurnOrder(t *testing.T) {
	ts := []string{targetReserve, targetReserveDirect, targetBare}
	if got := turnOrder(ts, 1); !slices.Equal(got, ts) {
		t.Errorf("round 1: %v, want %v", got, ts)
	}
	want := []string{targetBare, targetReserveDirect, targetReserve}
	if got := turnOrder(ts, 2); !slices.Equal(got, want) {
		t.Errorf("round 2: %v, want %v", got, want)
	}
	if got := turnOrder(ts, 3); !slices.Equal(got, ts) {
		t.Errorf("round 3: %v, want %v", got, ts)
	}
	if !slices.Equal(ts, []string{targetReserve, targetReserveDirect, targetBare}) {
		t.Errorf("turnOrder changed its argument: %v", ts)
	}
}

// A variant of the product runs on the product's schedule, the bare handler on
// its own; nothing is run for a target without a closed-loop figure.
func TestOpenLoopRateFollowsTheProduct(t *testing.T) {
	closed := func(target string, round int, rate float64) StormRow {
		return StormRow{Kind: kindReservations, Target: target, Concurrency: openLoopConns, Round: round, ReservationsPerSecond: rate}
	}
	r := &Report{Storms: []StormRow{
		closed(targetReserve, 1, 6000), closed(targetReserveDirect, 1, 1000), closed(targetBare, 1, 10000),
		closed(targetReserve, 2, 2000), closed(targetReserveDirect, 2, 1000), closed(targetBare, 2, 12000),
		closed(targetReserve, 3, 5000), closed(targetReserveDirect, 3, 1000), closed(targetBare, 3, 11000),
	}}
	for _, tc := range []struct {
		target string
		want   float64
	}{{targetReserve, 2500}, {targetReserveDirect, 2500}, {targetBare, 5500}, {targetBareDirect, 0}} {
		if got := r.openLoopRate(tc.target, 0.5); got != tc.want {
			t.Errorf("openLoopRate(%s, 0.5) = %v, want %v", tc.target, got, tc.want)
		}
	}
}

// The open-loop p99 held against the 10 ms target is the median of the
// rounds, so one storm that a busy minute hit does not decide it, and a round
// that fell behind its schedule is named; a variant's p99 is compared with the
// product's, medians and paired.
func TestOpenLoopRatiosUseMediansOfRounds(t *testing.T) {
	row := func(target string, round int, frac, p99 float64) StormRow {
		return StormRow{Kind: kindOpenLoop, Target: target, Concurrency: openLoopConns, Round: round, Rate: 3000,
			Note: scheduleNote(frac), RequestsPerSecond: 2997, ReservationsPerSecond: 2997, Latency: storm.LatencyMS{P50: 2, P99: p99}}
	}
	inside := func(s StormRow, request, script, batch float64) StormRow {
		s.Server = &ServerMetrics{RequestP99Ms: request, ScriptP99Ms: script, BatchP99Ms: batch}
		return s
	}
	behind := row(targetReserve, 1, 0.8, 40)
	behind.RequestsPerSecond = 2900 // below 98% of the 3000/s asked
	r := &Report{Storms: []StormRow{
		inside(row(targetReserve, 1, 0.5, 43), 30, 9, 8), row(targetReserveDirect, 1, 0.5, 46), row(targetBare, 1, 0.5, 9),
		behind, row(targetReserveDirect, 1, 0.8, 100),
		row(targetBare, 2, 0.5, 8), row(targetReserveDirect, 2, 0.5, 20), inside(row(targetReserve, 2, 0.5, 9), 7, 2, 3),
		row(targetReserveDirect, 2, 0.8, 120), row(targetReserve, 2, 0.8, 30),
		inside(row(targetReserve, 3, 0.5, 8), 6, 1, 2), row(targetReserveDirect, 3, 0.5, 4), row(targetBare, 3, 0.5, 10),
		row(targetReserve, 3, 0.8, 20), row(targetReserveDirect, 3, 0.8, 10),
	}}
	got := map[string]Ratio{}
	for _, x := range r.openLoopRatios() {
		got[x.Name] = x
	}
	check := func(name string, want float64, target string, met bool) Ratio {
		t.Helper()
		x, ok := got[name]
		if !ok {
			t.Fatalf("no ratio %q in %v", name, got)
		}
		if math.Abs(x.Value-want) > 1e-9 || x.Target != target || x.Met != met {
			t.Errorf("%s = %v (target %q, met %v), want %v (target %q, met %v)", name, x.Value, x.Target, x.Met, want, target, met)
		}
		return x
	}
	half := check("reserve open-loop p99, 50% of the closed-loop maximum (3000/s, 64 connections)", 9, "<= 10 ms", true)
	for _, want := range []string{"median of 3 rounds (43.00, 9.00, 8.00 ms)", "the bare handler on its own schedule (3000/s): p99 9.00 ms",
		"inside the process (its histograms, medians): request p99 7.00, reserve script p99 2.00, ledger batch p99 3.00 ms"} {
		if !strings.Contains(half.Detail, want) {
			t.Errorf("detail %q lacks %q", half.Detail, want)
		}
	}
	if strings.Contains(half.Detail, "behind") {
		t.Errorf("detail %q says a round fell behind; none did at 50%%", half.Detail)
	}
	eighty := check("reserve open-loop p99, 80% of the closed-loop maximum (3000/s, 64 connections)", 30, "", false)
	if want := "1 of 3 rounds fell behind the schedule"; !strings.Contains(eighty.Detail, want) {
		t.Errorf("detail %q lacks %q", eighty.Detail, want)
	}
	if strings.Contains(eighty.Detail, "inside the process") {
		t.Errorf("detail %q reports the process's histograms; no storm at 80%% read them", eighty.Detail)
	}
	direct := check("`flashsale reserve`, every reserve call alone (no pipeline) / `flashsale reserve` open-loop p99, 80% of the closed-loop maximum", 100.0/30*100, "", false)
	// Paired: 100/40, 120/30, 10/20 -> 2.5, 4, 0.5; the median 2.5.
	if want := "paired 250.0%"; !strings.Contains(direct.Detail, want) {
		t.Errorf("detail %q lacks %q", direct.Detail, want)
	}
	check("`flashsale reserve`, every reserve call alone (no pipeline) / `flashsale reserve` open-loop p99, 50% of the closed-loop maximum", 20.0/9*100, "", false)
	if n := len(got); n != 4 {
		t.Errorf("%d ratios, want 4 (reserve and its variant at two schedules): %v", n, got)
	}
}
