package engine_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// benchInFlight are the numbers of concurrent callers BenchmarkReserve runs
// with: 64, the buyers of the HTTP storms, and 256, where the engine's larger
// ledger batches pay for themselves.
var benchInFlight = []int{64, 256}

// benchRounds is how many times BenchmarkReserve alternates its variants: on a
// shared machine the rate drifts by more than the difference measured, so the
// variants take turns and a reader compares medians.
const benchRounds = 3

// BenchmarkReserve measures reservations/s through the whole engine (reserve script,
// epoch-fenced group commit into PostgreSQL) side by side with the raw reserve
// script driven directly on the same Redis: the ceiling. Every call reserves a unit
// (the allocation is far larger than b.N), so the figures are reservations, not
// sold-out answers. The variants are named <engine|raw-script>/<callers in
// flight> and alternate benchRounds times (engine/64, raw-script/64,
// engine/256, raw-script/256, engine/64#01, ...). Besides the rate, each
// reports the CPU time per reservation of this process (the engine or the raw
// client), of redis-server and of PostgreSQL (postmaster and backends): the
// three share the machine's cores. The engine variant also reports the mean
// rows per ledger batch, which sets PostgreSQL's cost per reservation.
func BenchmarkReserve(b *testing.B) {
	for range benchRounds {
		for _, inFlight := range benchInFlight {
			for _, kind := range []string{"engine", "raw-script"} {
				b.Run(fmt.Sprintf("%s/%d", kind, inFlight), func(b *testing.B) {
					b.SetParallelism(max(1, inFlight/runtime.GOMAXPROCS(0)))
					benchmarkReserve(b, kind)
				})
			}
		}
	}
}

func benchmarkReserve(b *testing.B, kind string) {
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr(), PoolSize: 256})
	defer rdb.Close()
	// Every run starts from an empty Redis: the reservations of earlier runs
	// would otherwise make the later ones pay for a larger keyspace.
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	var batches, rows atomic.Int64
	count := withMaterializer(ledger.MaterializerConfig{OnBatch: func(n int, _ time.Duration) {
		batches.Add(1)
		rows.Add(int64(n))
	}})
	f := newFixture(b, rdb, withAllocation(1_000_000_000), withShards(10), withMaxPerUser(1), count)
	var seq atomic.Int64
	cpu0 := markCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			user := "u" + strconv.FormatInt(seq.Add(1), 10)
			if kind == "engine" {
				r, err := f.e.Reserve(ctx, user, "r", 1)
				if err != nil || r.Outcome != engine.OutcomeReserved {
					b.Errorf("%+v %v", r, err)
					return
				}
				continue
			}
			home := stock.HomeShard(user, f.cfg.Shards)
			key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, "r")
			r, err := f.e.Store().Reserve(ctx, stock.ReserveRequest{
				Shard: home, Home: home, Mode: stock.ModeClaim, User: user, Key: key,
				Quantity: 1, MaxPerUser: 1, TTL: f.cfg.TTL,
			})
			if err != nil || r.Code != stock.Reserved {
				b.Errorf("%+v %v", r, err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reservations/s")
	markCPU().since(cpu0).report(b, b.N)
	if kind == "engine" && batches.Load() > 0 {
		b.ReportMetric(float64(rows.Load())/float64(batches.Load()), "rows/batch")
	}
}

// cpuMark is the CPU time used so far by this process, redis-server and
// PostgreSQL.
type cpuMark struct{ self, redis, postgres time.Duration }

func markCPU() cpuMark {
	return cpuMark{cpustat.Self(), cpustat.Process(sharedRedis.PID()), cpustat.Tree(sharedPG.PID())}
}

func (m cpuMark) since(o cpuMark) cpuMark {
	return cpuMark{m.self - o.self, m.redis - o.redis, m.postgres - o.postgres}
}

func (m cpuMark) report(b *testing.B, n int) {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	b.ReportMetric(per(m.self), "go-cpu-us/op")
	b.ReportMetric(per(m.redis), "redis-cpu-us/op")
	b.ReportMetric(per(m.postgres), "pg-cpu-us/op")
}

// BenchmarkRedisMemoryPerReservation reports the Redis memory one outstanding
// reservation costs (hash + expiry-index entry + the user's quota field), measured
// over 1,000 reservations on an otherwise empty server with a real 36-character
// campaign UID.
func BenchmarkRedisMemoryPerReservation(b *testing.B) {
	srv, err := testharness.StartRedis()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	var perRes float64
	for i := 0; i < b.N; i++ {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		campaign := fmt.Sprintf("7c9e6679-7425-40de-944b-e07fc1f9%04d", i%10000)
		s := stock.New(rdb, campaign, 10)
		for sh := 0; sh < 10; sh++ {
			if _, err := s.Seed(ctx, sh, 1_000_000, 1, stock.StateOpen, 0); err != nil {
				b.Fatal(err)
			}
		}
		before := usedMemory(b, rdb)
		const n = 1000
		for j := 0; j < n; j++ {
			user := fmt.Sprintf("user-%08d", j)
			home := stock.HomeShard(user, 10)
			r, err := s.Reserve(ctx, stock.ReserveRequest{
				Shard: home, Home: home, Mode: stock.ModeHome, User: user,
				Key:      stock.ReservationKey([]byte("0123456789abcdef"), campaign, user, "req"),
				Quantity: 1, MaxPerUser: 1, TTL: 600_000_000_000,
			})
			if err != nil || r.Code != stock.Reserved {
				b.Fatalf("%+v %v", r, err)
			}
		}
		perRes = float64(usedMemory(b, rdb)-before) / n
	}
	b.ReportMetric(perRes, "bytes/reservation")
	b.ReportMetric(perRes*1000, "bytes/1000-reservations")
}

func usedMemory(b *testing.B, rdb *redis.Client) int64 {
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no used_memory in INFO")
	return 0
}

// BenchmarkRedisMemoryPerRefusedBuyer reports the Redis memory left behind,
// once the engine is quiet, by buyers refused SOLD_OUT: the goal is 0 (a
// per-buyer field that drops to zero is deleted, and no quota is claimed when
// every other shard is known to be sold out). Each iteration sells out a sale
// of 10 shards on an otherwise empty server, then sends 1,000 new buyers with
// stealing on; probed/buyer is the share of them that claimed their quota on
// the home shard and probed other shards before being refused. It fails if
// the refused buyers changed any users hash or claims index.
func BenchmarkRedisMemoryPerRefusedBuyer(b *testing.B) {
	srv, err := testharness.StartRedis()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer rdb.Close()
	ctx := context.Background()
	const n = 1000
	var perBuyer, probed float64
	for i := 0; i < b.N; i++ {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		f := newFixture(b, rdb, withAllocation(10), withShards(10), withMaxPerUser(1), withSteal(2))
		for j := 0; f.counts().Available > 0; j++ {
			if _, err := f.e.Reserve(ctx, fmt.Sprintf("early-%d", j), "r", 1); err != nil {
				b.Fatal(err)
			}
		}
		perBuyerState := func() string {
			var out []string
			for sh := 0; sh < 10; sh++ {
				k := f.e.Store().Keys(sh)
				out = append(out, fmt.Sprint(rdb.HGetAll(ctx, k.Users()).Val(), rdb.ZCard(ctx, k.Claims()).Val()))
			}
			return strings.Join(out, " ")
		}
		state := perBuyerState()
		before := usedMemory(b, rdb)
		probes := 0
		for j := 0; j < n; j++ {
			r, err := f.e.Reserve(ctx, fmt.Sprintf("late-%08d", j), "r", 1)
			if err != nil || r.Outcome != engine.OutcomeSoldOut {
				b.Fatalf("%+v %v", r, err)
			}
			if r.Calls > 1 {
				probes++
			}
		}
		perBuyer = float64(usedMemory(b, rdb)-before) / n
		probed = float64(probes) / n
		if after := perBuyerState(); after != state {
			b.Fatalf("refused buyers left per-buyer state: before %s, after %s", state, after)
		}
	}
	b.ReportMetric(perBuyer, "bytes/refused-buyer")
	b.ReportMetric(probed, "probed/buyer")
}
