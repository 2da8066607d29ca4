package main

import (
	"slices"
	"testing"
)

func TestGoBenchMediansOverRepeatedRuns(t *testing.T) {
	out := `goos: linux
pkg: github.com/flashsale-dev/flashsale-operator/runtime/engine
BenchmarkReserve/engine/64-2         	   57156	     59927 ns/op	        36.25 go-cpu-us/op	     16687 reservations/s
BenchmarkReserve/raw-script/64-2     	  108573	     33058 ns/op	     30250 reservations/s
BenchmarkReserve/engine/64#01-2      	   82155	     50498 ns/op	        30.61 go-cpu-us/op	     19803 reservations/s
BenchmarkReserve/raw-script/64#01-2  	   90938	     33967 ns/op	     29440 reservations/s
BenchmarkReserve/engine/64#02-2      	   74307	     50368 ns/op	        29.43 go-cpu-us/op	     19854 reservations/s
BenchmarkReserve/raw-script/64#02-2  	  102868	     31222 ns/op	     32028 reservations/s
BenchmarkRedisMemoryPerReservation-2   30   290960 bytes/1000-reservations   291.0 bytes/reservation
PASS
`
	r := &Report{GoBench: parseGoBench(out)}
	if len(r.GoBench) != 7 {
		t.Fatalf("parsed %d benchmark lines, want 7", len(r.GoBench))
	}
	eng, runs, ok := r.metric("BenchmarkReserve/engine/64", "reservations/s")
	if !ok || eng != 19803 || !slices.Equal(runs, []float64{16687, 19803, 19854}) {
		t.Errorf("engine median %v runs %v ok %v", eng, runs, ok)
	}
	raw, _, _ := r.metric("BenchmarkReserve/raw-script/64", "reservations/s")
	if raw != 30250 {
		t.Errorf("raw median %v", raw)
	}
	if cpu, _, _ := r.metric("BenchmarkReserve/engine/64", "go-cpu-us/op"); cpu != 30.61 {
		t.Errorf("engine go cpu median %v", cpu)
	}
	if mem, _, ok := r.metric("BenchmarkRedisMemoryPerReservation", "bytes/reservation"); !ok || mem != 291 {
		t.Errorf("memory %v %v", mem, ok)
	}
	if _, _, ok := r.metric("BenchmarkReserve/engine", "reservations/s"); ok {
		t.Error("a prefix of a name matched")
	}
	for name, want := range map[string]string{"BenchmarkX/y#01-2": "BenchmarkX/y", "BenchmarkX-16": "BenchmarkX", "BenchmarkX/a-b": "BenchmarkX/a-b", "BenchmarkR/engine/64#02-2": "BenchmarkR/engine/64", "BenchmarkR/engine/64": "BenchmarkR/engine/64", "BenchmarkX/y#": "BenchmarkX/y#"} {
		if got := baseName(name); got != want {
			t.Errorf("baseName(%q) = %q, want %q", name, got, want)
		}
	}
}
