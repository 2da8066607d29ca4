package config

import (
	"math"
	"os"
	"runtime/debug"
)

// MemoryLimitShare is the share of its container's memory limit a process
// keeps its Go runtime to: the rest is for what the runtime does not count
// and the cgroup does (the kernel's socket buffers, the binary's pages it
// cannot reclaim at once). At the whole limit the runtime only collects
// harder where the kernel already kills.
const MemoryLimitShare = 0.9

// GoMemoryLimit is the Go runtime's memory limit for a container limit of
// bytes; 0: none (no limit, or one past int64).
func GoMemoryLimit(container uint64) int64 {
	if container == 0 || container > math.MaxInt64 {
		return 0
	}
	return int64(float64(container) * MemoryLimitShare)
}

// SetMemoryLimit keeps the Go runtime to GoMemoryLimit(container), unless
// GOMEMLIMIT says otherwise, and returns the limit it set (0: none).
func SetMemoryLimit(container uint64) int64 {
	lim := GoMemoryLimit(container)
	if lim == 0 || os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	debug.SetMemoryLimit(lim)
	return lim
}
