package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// goBenchTimeout bounds one `go test -bench` run (they start their own
// servers, a Redis Cluster among them).
const goBenchTimeout = 15 * time.Minute

// GoBench is one benchmark line of `go test -bench`.
type GoBench struct {
	Package    string             `json:"package"`
	Name       string             `json:"name"`
	Iterations int64              `json:"iterations"`
	Metrics    map[string]float64 `json:"metrics"` // unit -> value, e.g. "reservations/s"
}

// goBenchmarks are the existing Go benchmarks the report includes.
var goBenchmarks = []struct{ pkg, pattern string }{
	{"./runtime/engine/", "."}, // BenchmarkReserve (engine vs raw script), BenchmarkRedisMemoryPerReservation
	{"./runtime/ledger/", "Materializer"},
}

func goBenchArgs(pkg, pattern, benchtime string) []string {
	args := []string{"test", "-run", "^$", "-bench", pattern, "-count", "1", "-timeout", goBenchTimeout.String()}
	if benchtime != "" {
		args = append(args, "-benchtime", benchtime)
	}
	return append(args, pkg)
}

func runGoBenchmarks(ctx context.Context, root, benchtime string, rep *Report) error {
	for _, b := range goBenchmarks {
		args := goBenchArgs(b.pkg, b.pattern, benchtime)
		rep.GoBenchCommands = append(rep.GoBenchCommands, shellQuote(append([]string{"go"}, args...)))
		logf("go %s", strings.Join(args, " "))
		cctx, cancel := context.WithTimeout(ctx, goBenchTimeout+time.Minute)
		cmd := exec.CommandContext(cctx, "go", args...)
		cmd.Dir = root
		var out bytes.Buffer
		cmd.Stdout = io.MultiWriter(&out, os.Stderr)
		cmd.Stderr = os.Stderr
		err := cmd.Run()
		cancel()
		if err != nil {
			return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
		}
		rep.GoBench = append(rep.GoBench, parseGoBench(out.String())...)
	}
	return nil
}

// parseGoBench reads the "BenchmarkX-N  iters  v unit  v unit ..." lines.
func parseGoBench(out string) []GoBench {
	var res []GoBench
	pkg := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || len(f)%2 != 0 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		b := GoBench{Package: pkg, Name: f[0], Iterations: n, Metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				b.Metrics[f[i+1]] = v
			}
		}
		res = append(res, b)
	}
	return res
}

// metric is the median of a Go benchmark's metric over its runs: the name
// without the -N (GOMAXPROCS) and #NN (repeat) suffixes is namePrefix. It
// also returns every run's value, in order.
func (r *Report) metric(namePrefix, unit string) (float64, []float64, bool) {
	var vs []float64
	for _, b := range r.GoBench {
		if baseName(b.Name) != namePrefix {
			continue
		}
		if v, ok := b.Metrics[unit]; ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0, nil, false
	}
	return medianOf(vs), vs, true
}

// baseName strips "-N" and then "#NN" from "BenchmarkX/y#01-2".
func baseName(name string) string {
	if i := strings.LastIndexByte(name, '-'); i > 0 && allDigits(name[i+1:]) {
		name = name[:i]
	}
	if i := strings.LastIndexByte(name, '#'); i > 0 && allDigits(name[i+1:]) {
		name = name[:i]
	}
	return name
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// shellQuote writes a command so that it can be pasted into a shell.
func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, "^$*?[]{}()|&;<>'\" \t") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}
