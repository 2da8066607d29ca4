package storm

import (
	"math"
	"math/bits"
	"time"
)

// histogram records latencies in log-linear buckets: 32 sub-buckets per power
// of two of microseconds, so any percentile is within about 3% of the truth
// while memory stays fixed however long the storm runs.
type histogram struct {
	counts [64 * subBuckets]int64
	n      int64
	max    time.Duration
}

const (
	subBits    = 5
	subBuckets = 1 << subBits
)

func bucketOf(us uint64) int {
	if us < subBuckets {
		return int(us)
	}
	exp := bits.Len64(us) - subBits // ≥ 1
	return exp*subBuckets + int(us>>uint(exp-1)) - subBuckets
}

// bucketTop is the largest value in bucket b: reporting the top keeps
// percentiles pessimistic rather than flattering.
func bucketTop(b int) uint64 {
	if b < subBuckets {
		return uint64(b)
	}
	exp := b / subBuckets
	sub := uint64(b%subBuckets + subBuckets)
	return (sub+1)<<uint(exp-1) - 1
}

func (h *histogram) record(d time.Duration) {
	us := uint64(max(d, 0) / time.Microsecond)
	h.counts[bucketOf(us)]++
	h.n++
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the latency below which a fraction q of the samples lie.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	// Nearest rank: the smallest sample with at least q of them at or below it.
	rank := int64(math.Ceil(q*float64(h.n) - 1e-9))
	rank = min(max(rank, 1), h.n)
	var seen int64
	for b, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(bucketTop(b))*time.Microsecond, h.max)
		}
	}
	return h.max
}

// Latency summarises one operation's latencies.
type Latency struct {
	Count                    int64
	P50, P90, P99, P999, Max time.Duration
}

func (h *histogram) summary() Latency {
	return Latency{Count: h.n, P50: h.quantile(0.50), P90: h.quantile(0.90), P99: h.quantile(0.99), P999: h.quantile(0.999), Max: h.max}
}
