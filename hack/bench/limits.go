package main

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// The physical limits of this machine, whatever the project does: what
// redis-server takes for the reserve script and for a one-command script when
// nothing but redis-benchmark stands in front of it, and how fast PostgreSQL
// takes order-sized rows by COPY.

// LimitOptions are the physical-limits runs' settings.
type LimitOptions struct {
	Calls     int `json:"calls"`
	Clients   int `json:"clients"`
	Rounds    int `json:"rounds"`
	CopyRows  int `json:"copy_rows"`
	CopyBatch int `json:"copy_batch"`
}

func (l *LimitOptions) addFlags(fs *pflag.FlagSet) {
	fs.IntVar(&l.Calls, "limits-calls", 200_000, "redis-benchmark calls of each script run (each reserve call adds a live reservation)")
	fs.IntVar(&l.Clients, "limits-clients", 50, "redis-benchmark connections")
	fs.IntVar(&l.Rounds, "limits-rounds", 3, "times the scripts (reserve by EVALSHA and by FCALL, DECR, the empty script, 11 reads, the one-hash reserve) take turns under redis-benchmark")
	fs.IntVar(&l.CopyRows, "limits-copy-rows", 1_000_000, "order rows of the COPY run")
	fs.IntVar(&l.CopyBatch, "limits-copy-batch", 10_000, "rows per COPY (one transaction each)")
}

// LimitRow is one physical-limits run.
type LimitRow struct {
	Name        string  `json:"name"`
	Round       int     `json:"round"`
	Calls       int64   `json:"calls"`
	PerSecond   float64 `json:"per_second"`
	ServerCPUus float64 `json:"server_cpu_us_per_call"` // redis-server or PostgreSQL
	InCommandUs float64 `json:"in_command_us_per_call,omitempty"`
	// Redis's used_memory grown per call, for the scripts that keep what they
	// write (dict resizes come in powers of two, so one run is rough).
	BytesPerCall float64 `json:"redis_bytes_per_call,omitempty"`
	LoadBefore   Load    `json:"load_before"`
}

// Names of the limits runs.
const (
	limitReserve = "redis-benchmark EVALSHA reserve.lua (a new buyer each call)"
	limitDecr    = "redis-benchmark EVALSHA of a one-command script (DECR)"
	limitFcall   = "redis-benchmark FCALL of the same reserve body (FUNCTION LOAD)"
	limitCopy    = "PostgreSQL COPY of order rows"
)

func (e *benchEnv) limits(ctx context.Context) error {
	if err := e.setup(ctx); err != nil {
		return err
	}
	c, err := e.newCampaign(ctx, "limits", e.o.Allocation)
	if err != nil {
		return err
	}
	defer c.engine.Close()
	runID, err := e.runID(ctx)
	if err != nil {
		return err
	}
	// The body the product runs on this server, loaded as the product loads it.
	reserve := stock.ReserveScriptFor(runID)
	if err := reserve.Load(ctx, e.rdb).Err(); err != nil {
		return err
	}
	if err := decrScriptRef.Load(ctx, e.rdb).Err(); err != nil {
		return err
	}
	k := stock.ShardKeys(c.id, 0)
	if err := e.rdb.Set(ctx, decrKey(k), e.o.Allocation, 0).Err(); err != nil {
		return err
	}
	reserveArgs := []string{"EVALSHA", reserve.Hash(), "6", k.Stock(), k.Meta(), k.Index(), k.Res("b__rand_int__"), k.Users(), k.Claims(),
		"u__rand_int__", "b__rand_int__", "1", strconv.Itoa(maxPerUser), strconv.FormatInt(reservationTT.Milliseconds(), 10),
		"", "0", string(stock.ModeClaim), "0", "a__rand_int__"}
	decrArgs := []string{"EVALSHA", decrScriptRef.Hash(), "1", decrKey(k)}
	body, err := reserveBody(runID, reserve.Hash())
	if err != nil {
		return err
	}
	if err := e.loadReserveFunction(ctx, body); err != nil {
		return err
	}
	packed, err := packedReserveScript(body)
	if err != nil {
		return err
	}
	for _, s := range []*redis.Script{emptyScriptRef, readsScriptRef, packed} {
		if err := s.Load(ctx, e.rdb).Err(); err != nil {
			return err
		}
	}
	fcallArgs := append([]string{"FCALL", reserveFunction}, reserveArgs[2:]...)
	runs := append([]limitRun{{limitReserve, k.Stock(), reserveArgs}, {limitFcall, k.Stock(), fcallArgs}, {limitDecr, decrKey(k), decrArgs}},
		floorRuns(k, reserveArgs, packed)...)
	for round := 1; round <= e.o.Limits.Rounds; round++ {
		for _, r := range runs {
			row, err := e.redisBenchmark(ctx, r.name, round, r.counter, r.args)
			if err != nil {
				return err
			}
			e.rep.Limits = append(e.rep.Limits, row)
		}
	}
	row, err := e.copyRows(ctx)
	if err != nil {
		return err
	}
	e.rep.Limits = append(e.rep.Limits, row)
	if e.o.skips("commits") {
		return nil
	}
	if row, err = e.commitRows(ctx); err != nil {
		return err
	}
	e.rep.Limits = append(e.rep.Limits, row)
	return nil
}

// decrScriptRef is the decr backend's script (hack/bench/bare/decr.go).
var decrScriptRef = redis.NewScript(`return redis.call('DECR', KEYS[1])`)

// infoField is one field of a section of the server's INFO ("" when absent).
func (e *benchEnv) infoField(ctx context.Context, section, name string) (string, error) {
	info, err := e.rdb.Info(ctx, section).Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v, nil
		}
	}
	return "", nil
}

func (e *benchEnv) runID(ctx context.Context) (string, error) {
	id, err := e.infoField(ctx, "server", "run_id")
	if err == nil && id == "" {
		err = fmt.Errorf("INFO server has no run_id")
	}
	return id, err
}

// reserveFunction is the reserve body loaded as a Redis function.
const reserveFunction = "flashsale_bench_reserve"

// reserveBody is the body the product runs on this server: reserve.lua with
// this server's run id, checked against the SHA the product loaded.
func reserveBody(runID, sha string) (string, error) {
	src, err := os.ReadFile(repoPath(testharness.RepoRoot(), "runtime", "stock", "scripts", "reserve.lua"))
	if err != nil {
		return "", err
	}
	body := strings.Replace(string(src), "'SERVER_RUN_ID'", strconv.Quote(runID), 1)
	if h := sha1.Sum([]byte(body)); hex.EncodeToString(h[:]) != sha {
		return "", fmt.Errorf("reserve.lua with the run id is not the body the product loads (sha %x, want %s)", h, sha)
	}
	return body, nil
}

// loadReserveFunction loads the product's reserve body as a function
// library, to price FCALL against EVALSHA of the same code.
func (e *benchEnv) loadReserveFunction(ctx context.Context, body string) error {
	lib := "#!lua name=flashsale_bench\nredis.register_function('" + reserveFunction + "', function(KEYS, ARGV)\n" + body + "\nend)\n"
	return e.rdb.FunctionLoadReplace(ctx, lib).Err()
}

// redisUsedMemory is INFO memory's used_memory, in bytes.
func (e *benchEnv) redisUsedMemory(ctx context.Context) (int64, error) {
	v, err := e.infoField(ctx, "memory", "used_memory")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// evalshaStats is INFO commandstats' calls and usec of EVALSHA and FCALL.
func (e *benchEnv) evalshaStats(ctx context.Context) (calls, usec int64) {
	info, err := e.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		v, ok := strings.CutPrefix(line, "cmdstat_evalsha:")
		if !ok {
			if v, ok = strings.CutPrefix(line, "cmdstat_fcall:"); !ok {
				continue
			}
		}
		for _, f := range strings.Split(v, ",") {
			k, n, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				c, _ := strconv.ParseInt(n, 10, 64)
				calls += c
			case "usec":
				u, _ := strconv.ParseInt(n, 10, 64)
				usec += u
			}
		}
	}
	return calls, usec
}

// redisBenchmark runs args under redis-benchmark; counter is the stock key
// each call must decrement ("": the script takes nothing).
func (e *benchEnv) redisBenchmark(ctx context.Context, name string, round int, counter string, args []string) (LimitRow, error) {
	row := LimitRow{Name: name, Round: round, LoadBefore: readLoad()}
	logf("limits: %s, round %d (load %s)", name, round, row.LoadBefore)
	// Buyers of earlier runs hold their unit: each run draws its own, so only
	// a buyer drawn twice within the run is refused.
	e.limitRuns++
	args = slices.Clone(args)
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "__rand_int__", fmt.Sprintf("r%d-__rand_int__", e.limitRuns))
	}
	cmdArgs := append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(e.redis.Port()), "-c", strconv.Itoa(e.o.Limits.Clients),
		"-n", strconv.Itoa(e.o.Limits.Calls), "-r", "1000000000", "-q"}, args...)
	// What a script that takes units leaves behind: its stock and memory.
	var before, mem0 int64
	if counter != "" {
		var err error
		if before, err = e.rdb.Get(ctx, counter).Int64(); err != nil {
			return row, err
		}
		if mem0, err = e.redisUsedMemory(ctx); err != nil {
			return row, err
		}
	}
	calls0, usec0 := e.evalshaStats(ctx)
	cpu0, t0 := e.redisCPU(ctx), time.Now()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(cctx, "redis-benchmark", cmdArgs...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return row, fmt.Errorf("redis-benchmark: %v\n%s%s", err, out, stderr.String())
	}
	elapsed := time.Since(t0)
	cpu := e.redisCPU(ctx) - cpu0
	calls1, usec1 := e.evalshaStats(ctx)
	row.Calls = calls1 - calls0
	if row.Calls < int64(e.o.Limits.Calls) {
		return row, fmt.Errorf("redis-benchmark %s: %d script calls reached the server, want %d\n%s", name, row.Calls, e.o.Limits.Calls, out)
	}
	// Every call took a unit: the run measured reservations, not refusals. A
	// random buyer drawn twice (about calls²/2e9 of them) is refused, no more.
	if counter != "" {
		if left, err := e.rdb.Get(ctx, counter).Int64(); err != nil || before-left < row.Calls-row.Calls/1000-1 {
			return row, fmt.Errorf("%s: %d calls took %d units (%v): not every call reserved", name, row.Calls, before-left, err)
		}
		mem, err := e.redisUsedMemory(ctx)
		if err != nil {
			return row, err
		}
		row.BytesPerCall = float64(mem-mem0) / float64(row.Calls)
	}
	row.PerSecond = float64(row.Calls) / elapsed.Seconds()
	row.ServerCPUus = float64(cpu.Microseconds()) / float64(row.Calls)
	row.InCommandUs = float64(usec1-usec0) / float64(row.Calls)
	logf("limits: %s: %.0f calls/s, %.1f µs redis CPU, %.1f µs in-command per call", name, row.PerSecond, row.ServerCPUus, row.InCommandUs)
	return row, nil
}

// copyRows COPYs order rows, CopyBatch per transaction, into a new database.
func (e *benchEnv) copyRows(ctx context.Context) (LimitRow, error) {
	row := LimitRow{Name: limitCopy, Round: 1, LoadBefore: readLoad()}
	dsn, err := e.bucketDatabase(ctx, 1)
	if err != nil {
		return row, err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return row, err
	}
	defer conn.Close(context.Background())
	logf("limits: %s, %d rows (load %s)", limitCopy, e.o.Limits.CopyRows, row.LoadBefore)
	cols := []string{"token", "sku", "user_id", "bucket", "qty", "expires_at"}
	exp := time.Now().Add(reservationTT)
	pg0, t0 := e.postgresCPU(ctx), time.Now()
	for done := 0; done < e.o.Limits.CopyRows; {
		n := min(e.o.Limits.CopyBatch, e.o.Limits.CopyRows-done)
		rows := make([][]any, n)
		for i := range rows {
			// A reservation key's length (43) and a user id like the storm's.
			id := done + i
			rows[i] = []any{fmt.Sprintf("%043d", id), benchSKU, fmt.Sprintf("copy-buyer-%d", id), int32(id % 64), int32(1), exp}
		}
		m, err := conn.CopyFrom(ctx, pgx.Identifier{"bucket_orders"}, cols, pgx.CopyFromRows(rows))
		if err != nil {
			return row, err
		}
		done += int(m)
		row.Calls += m
	}
	elapsed := time.Since(t0)
	row.PerSecond = float64(row.Calls) / elapsed.Seconds()
	row.ServerCPUus = float64((e.postgresCPU(ctx) - pg0).Microseconds()) / float64(row.Calls)
	logf("limits: COPY %.0f rows/s, %.1f µs PostgreSQL CPU per row", row.PerSecond, row.ServerCPUus)
	return row, nil
}
