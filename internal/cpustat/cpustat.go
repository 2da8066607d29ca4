// Package cpustat reads the CPU time processes have used, from /proc, so that
// benchmarks can say where the CPU of a request went (client, server, Redis,
// PostgreSQL) on a machine they share.
package cpustat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// Process is the user+system CPU time pid has used (0 when unreadable).
func Process(pid int) time.Duration {
	f := statFields(pid)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// Tree is Process of pid plus that of its live children: a postmaster and its
// backends. Children that exited in between are not counted.
func Tree(pid int) time.Duration {
	total := Process(pid)
	for _, c := range Children(pid) {
		total += Process(c)
	}
	return total
}

// TreeWithExited is Tree plus the CPU time of the children pid has reaped
// (a postmaster's backends that ended), so that a count taken before and after
// a run does not go down when a connection closes.
func TreeWithExited(pid int) time.Duration {
	total := Tree(pid)
	if f := statFields(pid); len(f) >= 15 {
		cut, _ := strconv.ParseInt(f[13], 10, 64)
		cst, _ := strconv.ParseInt(f[14], 10, 64)
		total += time.Duration(cut+cst) * time.Second / clockTicks
	}
	return total
}

// Children lists the live children of pid.
func Children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	parent := strconv.Itoa(pid)
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(child); len(f) > 1 && f[1] == parent {
			out = append(out, child)
		}
	}
	return out
}

// statFields are the fields of /proc/<pid>/stat after the command name, which
// may contain spaces: f[0] is the state, f[1] the parent pid.
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	rest := string(b)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	return strings.Fields(rest)
}

// Self is this process's user+system CPU time.
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// MachineBusy is the CPU time every process of the machine has used since
// boot, from /proc/stat: what is neither idle nor waiting for I/O.
func MachineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		busy += n
	}
	return time.Duration(busy) * time.Second / clockTicks
}
