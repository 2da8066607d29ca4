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
