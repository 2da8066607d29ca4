package main

import (
	"testing"
	"time"
)

// Nearest rank: of 1..160 ms, the p99 is the 159th value (⌈0.99·160⌉), the
// p50 the 80th and the p90 the 144th; rounding the rank instead gave the
// 158th.
func TestSummarizeTakesTheNearestRank(t *testing.T) {
	d := make([]time.Duration, 160)
	for i := range d {
		d[len(d)-1-i] = time.Duration(i+1) * time.Millisecond // unsorted
	}
	got := summarize(d)
	if got.Count != 160 || got.P50 != 80 || got.P90 != 144 || got.P99 != 159 || got.Max != 160 {
		t.Errorf("summarize(1..160 ms) = %+v; want p50 80, p90 144, p99 159, max 160", got)
	}
	if one := summarize([]time.Duration{7 * time.Millisecond}); one.P50 != 7 || one.P99 != 7 {
		t.Errorf("one sample: %+v", one)
	}
}
