package ledger

import (
	"slices"
	"testing"
)

func TestSplitAllocation(t *testing.T) {
	tests := []struct {
		total  int64
		shards int
		want   []int64
	}{
		{0, 1, []int64{0}},
		{0, 3, []int64{0, 0, 0}},
		{1, 3, []int64{1, 0, 0}},
		{2, 3, []int64{1, 1, 0}},
		{3, 3, []int64{1, 1, 1}},
		{10, 3, []int64{4, 3, 3}},
		{1000, 10, []int64{100, 100, 100, 100, 100, 100, 100, 100, 100, 100}},
		{1003, 10, []int64{101, 101, 101, 100, 100, 100, 100, 100, 100, 100}},
		{7, 1, []int64{7}},
		{5, 0, nil},
	}
	for _, tt := range tests {
		if got := SplitAllocation(tt.total, tt.shards); !slices.Equal(got, tt.want) {
			t.Errorf("SplitAllocation(%d, %d) = %v, want %v", tt.total, tt.shards, got, tt.want)
		}
	}
}

func TestSpreadDelta(t *testing.T) {
	tests := []struct {
		delta  int64
		shards int
		start  int
		want   []int64
	}{
		{0, 3, 1, []int64{0, 0, 0}},
		{2, 3, 1, []int64{0, 1, 1}},
		{2, 3, 2, []int64{1, 0, 1}}, // wraps around
		{5, 3, 0, []int64{2, 2, 1}},
		{5, 3, 2, []int64{2, 1, 2}},
		{7, 1, 0, []int64{7}},
		{9, 4, 3, []int64{2, 2, 2, 3}},
		{11, 4, 3, []int64{3, 3, 2, 3}},
	}
	for _, tt := range tests {
		if got := spreadDelta(tt.delta, tt.shards, tt.start); !slices.Equal(got, tt.want) {
			t.Errorf("spreadDelta(%d, %d, %d) = %v, want %v", tt.delta, tt.shards, tt.start, got, tt.want)
		}
	}
}

// Starting the remainder at old % shards makes a restock land exactly where a
// fresh split of the new total would have put the units, so shards stay even
// through any number of increases.
func TestSpreadDeltaKeepsSplitShape(t *testing.T) {
	for shards := 1; shards <= 7; shards++ {
		for old := int64(0); old <= 40; old++ {
			for delta := int64(0); delta <= 30; delta++ {
				have := SplitAllocation(old, shards)
				d := spreadDelta(delta, shards, int(old%int64(shards)))
				var sum int64
				for i := range have {
					have[i] += d[i]
					sum += d[i]
				}
				if sum != delta {
					t.Fatalf("shards %d old %d delta %d: deltas %v sum to %d", shards, old, delta, d, sum)
				}
				if want := SplitAllocation(old+delta, shards); !slices.Equal(have, want) {
					t.Fatalf("shards %d old %d delta %d: got %v, want %v", shards, old, delta, have, want)
				}
			}
		}
	}
}
