package storm

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketsAreMonotonicAndTight(t *testing.T) {
	prev := -1
	for us := uint64(0); us < 1<<22; us += 1 + us/200 {
		b := bucketOf(us)
		if b < prev {
			t.Fatalf("bucket of %d is %d, below %d", us, b, prev)
		}
		prev = b
		if top := bucketTop(b); top < us || float64(top-us) > 0.04*float64(us)+1 {
			t.Fatalf("value %d in bucket %d with top %d", us, b, top)
		}
	}
}

func TestQuantilesMatchSortedSamples(t *testing.T) {
	var h histogram
	r := rand.New(rand.NewPCG(1, 2))
	samples := make([]time.Duration, 20000)
	for i := range samples {
		// Log-normal-ish: most fast, a long tail.
		samples[i] = time.Duration(r.ExpFloat64()*2e6) + time.Duration(r.IntN(100))*time.Microsecond
		h.record(samples[i])
	}
	slices.Sort(samples)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		want := samples[int(q*float64(len(samples)))-1]
		got := h.quantile(q)
		if d := float64(got-want) / float64(want); d < -0.01 || d > 0.05 {
			t.Errorf("p%v = %v, want about %v", q*100, got, want)
		}
	}
	if h.max != samples[len(samples)-1] {
		t.Errorf("max %v, want %v", h.max, samples[len(samples)-1])
	}
	var empty histogram
	if s := empty.summary(); s.Count != 0 || s.P99 != 0 {
		t.Errorf("empty summary %+v", s)
	}
	var merged histogram
	merged.merge(&h)
	merged.merge(&empty)
	if merged.summary() != h.summary() {
		t.Error("merge changed the summary")
	}
}

// Percentiles are nearest-rank: p90 of 1..9 ms is 9 ms, p99 of 1..70 ms is 70.
func TestQuantileIsNearestRank(t *testing.T) {
	for _, tc := range []struct {
		n      int
		q      float64
		wantMS int
	}{{9, 0.9, 9}, {70, 0.99, 70}, {10, 0.5, 5}, {100, 0.9, 90}} {
		var h histogram
		for i := 1; i <= tc.n; i++ {
			h.record(time.Duration(i) * time.Millisecond)
		}
		want := time.Duration(tc.wantMS) * time.Millisecond
		if got := h.quantile(tc.q); got < want || float64(got-want) > 0.04*float64(want) {
			t.Errorf("p%v of 1..%d ms = %v, want %v", tc.q*100, tc.n, got, want)
		}
	}
}
