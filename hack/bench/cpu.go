package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
)

// redisCPU is redis-server's user+system CPU so far, from INFO cpu.
func (e *benchEnv) redisCPU(ctx context.Context) time.Duration {
	info, err := e.rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// postgresCPU is the CPU used so far by the postmaster and its children,
// live and exited.
func (e *benchEnv) postgresCPU(ctx context.Context) time.Duration {
	if e.postmaster == 0 {
		conn, err := pgx.Connect(ctx, e.pg.AdminDSN())
		if err != nil {
			return 0
		}
		var dir string
		err = conn.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dir)
		conn.Close(ctx)
		if err != nil {
			return 0
		}
		b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
		if err != nil {
			return 0
		}
		first, _, _ := strings.Cut(string(b), "\n")
		e.postmaster, _ = strconv.Atoi(strings.TrimSpace(first))
	}
	// With the exited backends' CPU, which the postmaster reaped: a backend
	// that exits in the window would otherwise take all of its CPU out of
	// the difference.
	return cpustat.TreeWithExited(e.postmaster)
}
