package config

import (
	"math"
	"testing"
)

// The Go runtime keeps to nine tenths of the container's limit; a limit the
// downward API cannot give (unset: 0) or past int64 sets none.
func TestGoMemoryLimit(t *testing.T) {
	for container, want := range map[uint64]int64{0: 0, 256 << 20: 241591910, 12 << 20: 11324620, math.MaxUint64: 0} {
		if got := GoMemoryLimit(container); got != want {
			t.Errorf("GoMemoryLimit(%d) = %d, want %d", container, got, want)
		}
	}
}
