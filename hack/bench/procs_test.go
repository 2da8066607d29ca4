package main

import (
	"os"
	"testing"
)

// The peak resident set is read from its line of /proc/<pid>/status, and
// nothing else passes for it.
func TestProcKB(t *testing.T) {
	for status, want := range map[string]int64{
		"Name:\tflashsale\nVmPeak:\t 2000 kB\nVmHWM:\t   153600 kB\nVmRSS:\t 1024 kB\n": 150 << 20,
		"VmHWM:\t0 kB\n":              0,
		"VmRSS:\t1024 kB\n":           0,
		"VmHWM:\t12 MB\n":             0,
		"VmHWM:\t-5 kB\n":             0,
		"VmHWM:\tlots kB\n":           0,
		"":                            0,
		"XVmHWM:\t1 kB\nVmHWM:\t2 kB": 2 << 10,
	} {
		if got := procKB(status, "VmHWM"); got != want {
			t.Errorf("procKB(%q, VmHWM) = %d, want %d", status, got, want)
		}
	}
	if got := procKB("MemTotal:       24576000 kB\nMemFree:  1 kB\n", "MemTotal"); got != 24576000<<10 {
		t.Errorf("MemTotal = %d, want %d", got, int64(24576000)<<10)
	}
	// This process's own.
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if procKB(string(b), "VmHWM") <= 0 {
		t.Fatalf("no VmHWM in this process's status:\n%s", b)
	}
}
