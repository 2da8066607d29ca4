package stock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// EnvTestReservePipeline, set to a batch size, sends every reserve call of
// this package's tests through pipelines of that size (and the engine's tests
// through the engine's own setting): `FLASHSALE_TEST_RESERVE_PIPELINE=32 go test`.
const EnvTestReservePipeline = "FLASHSALE_TEST_RESERVE_PIPELINE"

func init() {
	if n, err := strconv.Atoi(os.Getenv(EnvTestReservePipeline)); err == nil {
		testDefaultPipeline = PipelineConfig{MaxBatch: n}
	}
}

// pipelineSizes records the size of every pipeline sent while it is set.
type pipelineSizes struct {
	mu    sync.Mutex
	sizes []int
	errs  int
}

func recordPipelines(t *testing.T) *pipelineSizes {
	p := &pipelineSizes{}
	testHookPipelineSent = func(n int, err error) {
		p.mu.Lock()
		p.sizes = append(p.sizes, n)
		if err != nil {
			p.errs++
		}
		p.mu.Unlock()
	}
	t.Cleanup(func() { testHookPipelineSent = nil })
	return p
}

func (p *pipelineSizes) largest() (n, calls int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.sizes {
		n, calls = max(n, s), calls+s
	}
	return n, calls
}

// Many buyers at once, each sending three requests of its own (new request
// ids) with maxPerUser 1, through pipelines: no shard sells more than it has
// (I1), every unit is in stock or in a reservation (I2), and no buyer holds
// two (I5), on a standalone Redis and on a Redis Cluster, where each
// pipeline goes to the master of its calls' slot.
func TestPipelinedReservesKeepStockAndLimits(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "cluster" && testing.Short() {
				t.Skip("starts a Redis Cluster")
			}
			var rdb redis.UniversalClient
			if mode == "cluster" {
				rdb = clusterLikeProduction(testharness.RedisClusterT(t).Addrs())
			} else {
				rdb = clientLikeProduction(testharness.RedisT(t).Addr())
			}
			t.Cleanup(func() { _ = rdb.Close() })
			const shards, units, buyers, perBuyer = 4, 40, 200, 3
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			s := New(rdb, "pipe-"+mode+"-"+strconv.FormatInt(time.Now().UnixNano(), 36), shards).
				WithPipeline(PipelineConfig{MaxBatch: 32})
			for i := range shards {
				if _, err := s.Seed(ctx, i, units, 1, StateOpen, 0); err != nil {
					t.Fatal(err)
				}
			}
			sent := recordPipelines(t)
			var (
				wg       sync.WaitGroup
				start    = make(chan struct{})
				mu       sync.Mutex
				held     = map[string]int{}
				reserved atomic.Int64
				errs     []error
			)
			for b := range buyers {
				user := fmt.Sprintf("buyer-%d", b)
				home := HomeShard(user, shards)
				for k := range perBuyer {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						r, err := s.Reserve(ctx, ReserveRequest{Shard: home, Home: home, Mode: ModeHome, User: user,
							Key: fmt.Sprintf("k-%s-%d", user, k), Quantity: 1, MaxPerUser: 1, TTL: time.Minute})
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err != nil:
							errs = append(errs, err)
						case r.Code == Reserved:
							held[user]++
							reserved.Add(1)
						case r.Code != SoldOut && r.Code != Limit:
							errs = append(errs, fmt.Errorf("%s: %v", user, r.Code))
						}
					}()
				}
			}
			close(start)
			wg.Wait()
			if len(errs) > 0 {
				t.Fatalf("%d calls failed, first: %v", len(errs), errs[0])
			}
			for user, n := range held {
				if n > 1 {
					t.Errorf("%s holds %d units, maxPerUser is 1", user, n)
				}
			}
			states, err := s.State(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var avail, rsv int64
			for _, st := range states {
				if st.Available < 0 || st.Available+st.Reserved != units {
					t.Errorf("shard %d: %d available + %d reserved, allocation %d", st.Index, st.Available, st.Reserved, units)
				}
				avail, rsv = avail+st.Available, rsv+st.Reserved
			}
			if rsv != reserved.Load() {
				t.Errorf("Redis holds %d reserved units, the callers were told of %d", rsv, reserved.Load())
			}
			largest, calls := sent.largest()
			t.Logf("%d reserved, %d available; %d calls in %d pipelines, the largest %d", rsv, avail, calls, len(sent.sizes), largest)
			if calls != buyers*perBuyer || largest < 2 {
				t.Fatalf("pipelines carried %d of %d calls, the largest %d: the calls were not batched", calls, buyers*perBuyer, largest)
			}
		})
	}
}

// stallPipeline injects a fault on the server when the first pipeline of
// reserve calls is about to be sent (a client hook, so the fault covers that
// pipeline and no other).
type stallPipeline struct {
	armed   atomic.Bool
	inject  func(ctx context.Context) (func(context.Context) error, error)
	mu      sync.Mutex
	restore func(context.Context) error
	err     error
}

func (h *stallPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *stallPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *stallPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "evalsha" && h.armed.CompareAndSwap(true, false) {
			restore, err := h.inject(ctx)
			h.mu.Lock()
			h.restore, h.err = restore, err
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// A pipeline of reserve calls whose replies are lost (the server asleep past
// the client's read timeout, CLIENT PAUSE, the replies swallowed by the fault
// proxy) fails every call in it, as a lost single reply does, and is never
// sent again: each script ran once at most (once exactly when the server
// got it), no request holds two units, and the same requests sent again are
// answered from what the lost run did (REPLAY), not reserved a second time.
func TestStalledPipelineLosesEveryReplyOnce(t *testing.T) {
	r := testharness.RedisT(t)
	proxy := testharness.FaultProxyT(t, r.Addr())
	admin := redis.NewClient(&redis.Options{Addr: r.Addr(), ReadTimeout: 30 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = admin.Close() })
	type fault struct {
		name      string
		viaProxy  bool
		atMostOne bool // CLIENT PAUSE drops a paused command whose client hung up
		inject    func(ctx context.Context) (func(context.Context) error, error)
	}
	faults := []fault{
		{name: "debug-sleep", inject: func(ctx context.Context) (func(context.Context) error, error) {
			return debugSleepOn(ctx, r.Addr())
		}},
		{name: "client-pause", atMostOne: true, inject: func(ctx context.Context) (func(context.Context) error, error) {
			if err := admin.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error { return admin.Do(ctx, "CLIENT", "UNPAUSE").Err() }, nil
		}},
		{name: "proxy-timeout", viaProxy: true, inject: func(context.Context) (func(context.Context) error, error) {
			if _, err := proxy.Timeout(testharness.Downstream, 0); err != nil {
				return nil, err
			}
			return func(context.Context) error { proxy.RemoveAll(); return nil }, nil
		}},
	}
	const calls = 8
	for i, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			addr := r.Addr()
			if f.viaProxy {
				addr = proxy.Addr()
			}
			// go-redis's default retries (3), which a pipeline of
			// commands that say NoRetry must not use.
			rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: time.Second, WriteTimeout: time.Second})
			t.Cleanup(func() { _ = rdb.Close() })
			hook := &stallPipeline{inject: f.inject}
			rdb.AddHook(hook)
			// A linger far beyond the test: the pipeline goes when all the
			// calls are in it, so one pipeline carries them all.
			campaign := fmt.Sprintf("stall-%d-%d", i, time.Now().UnixNano())
			s := New(rdb, campaign, 1).WithPipeline(PipelineConfig{MaxBatch: calls, Linger: time.Hour})
			if _, err := s.Seed(ctx, 0, 100, 1, StateOpen, 0); err != nil {
				t.Fatal(err)
			}
			// Loaded before the fault, so that no call meets NOSCRIPT (by a
			// store that does not batch: alone, a call would linger).
			direct := New(rdb, campaign, 1).WithPipeline(PipelineConfig{})
			if _, err := reserveOne(ctx, direct, "warm"); err != nil {
				t.Fatal(err)
			}
			if err := admin.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			sent := recordPipelines(t)
			hook.armed.Store(true)
			errs := make([]error, calls)
			var wg sync.WaitGroup
			for c := range calls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[c] = reserveOne(ctx, s, fmt.Sprintf("u%d", c))
				}()
			}
			wg.Wait()
			hook.mu.Lock()
			restore, injectErr := hook.restore, hook.err
			hook.mu.Unlock()
			if injectErr != nil || restore == nil {
				t.Fatalf("fault not injected: %v", injectErr)
			}
			if err := restore(ctx); err != nil {
				t.Fatalf("restore: %v", err)
			}
			if largest, n := sent.largest(); largest != calls || n != calls {
				t.Fatalf("pipelines sent %d calls, the largest %d; want one pipeline of %d", n, largest, calls)
			}
			for c, err := range errs {
				if err == nil {
					t.Fatalf("call %d succeeded: the fault did not cover the pipeline", c)
				}
			}
			t.Logf("every call failed, e.g. %v", errs[0])
			runs := testharness.ScriptRuns(t, admin)
			for deadline := time.Now().Add(30 * time.Second); !f.atMostOne && runs < calls; runs = testharness.ScriptRuns(t, admin) {
				if time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if runs > calls || !f.atMostOne && runs != calls {
				t.Fatalf("the scripts ran %d times for %d calls sent once", runs, calls)
			}
			// The lost-reply path: the same requests again find what ran
			// (one by one, so not through the lingering pipeline).
			replays := 0
			for c := range calls {
				res, err := reserveOne(ctx, direct, fmt.Sprintf("u%d", c))
				if err != nil {
					t.Fatalf("retry of call %d: %v", c, err)
				}
				switch res.Code {
				case Replay:
					replays++
				case Reserved: // the lost run never ran (CLIENT PAUSE dropped it)
				default:
					t.Fatalf("retry of call %d: %v", c, res.Code)
				}
			}
			if replays != runs {
				t.Errorf("%d retries replayed, but the scripts ran %d times", replays, runs)
			}
			st, err := s.State(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st[0].Reserved != calls+1 || st[0].Available+st[0].Reserved != 100 {
				t.Errorf("after %d requests (and the warm-up): %d reserved, %d available; want %d reserved of 100",
					calls, st[0].Reserved, st[0].Available, calls+1)
			}
		})
	}
}

// debugSleepOn blocks the server for 3 s (the read timeout is 1 s) and
// returns once a probe finds it asleep.
func debugSleepOn(ctx context.Context, addr string) (func(context.Context) error, error) {
	probe := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 50 * time.Millisecond, MaxRetries: -1, PoolSize: 1})
	defer probe.Close()
	if err := testharness.PingAwake(ctx, probe); err != nil { // connected before the sleep
		return nil, err
	}
	sleeper := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 30 * time.Second, MaxRetries: -1})
	done := make(chan error, 1)
	go func() { done <- sleeper.Do(ctx, "DEBUG", "SLEEP", "3").Err(); _ = sleeper.Close() }()
	for {
		select {
		case err := <-done:
			return nil, fmt.Errorf("DEBUG SLEEP ended before a probe saw it: %v", err)
		default:
		}
		err := probe.Ping(ctx).Err()
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
			return func(context.Context) error { return <-done }, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// A caller whose context ends while its call waits for a pipeline gets
// ErrNotSent, and nothing runs for it.
func TestQueuedCallGivesUpUnsent(t *testing.T) {
	_, rdb, s := oneShard(t, 10)
	s.WithPipeline(PipelineConfig{MaxBatch: 4, Linger: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := reserveOne(ctx, s, "alone")
	if !errors.Is(err, ErrNotSent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call alone in a lingering pipeline: %v, want ErrNotSent and the deadline", err)
	}
	if n, err := rdb.Exists(context.Background(), s.Keys(0).Res("k-alone")).Result(); err != nil || n != 0 {
		t.Fatalf("the unsent call left a reservation: %d %v", n, err)
	}
}

// A caller whose context ends once its call is in a pipeline still gets the
// call's reply, as a single command's caller does: told nothing, it could
// not tell the unit it took from one placed before, and would leave it held
// with no ledger row, refusing the buyer's retries until the unit expired.
// The context ends (deterministically) after the reply came and before the
// pipeline hands it out.
func TestCallInAPipelineAwaitsItsReply(t *testing.T) {
	_, rdb, s := oneShard(t, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := reserveOne(ctx, s, "warm"); err != nil { // loads the script
		t.Fatal(err)
	}
	rdb.AddHook(afterPipeline(func() {
		cancel()
		time.Sleep(200 * time.Millisecond) // the caller sees its context end first
	}))
	s.WithPipeline(PipelineConfig{MaxBatch: 4})
	res, err := reserveOne(ctx, s, "late")
	if err != nil || res.Code != Reserved {
		t.Fatalf("a call whose context ended in its pipeline: %v %v, want its reply (RESERVED)", res.Code, err)
	}
}

// afterPipeline runs then after each pipeline's replies are read, before the
// pipeline returns.
type afterPipeline func()

func (h afterPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h afterPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h afterPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h()
		return err
	}
}

// Negative sizes, lingers and pipeline counts are refused.
func TestPipelineConfigRefusesNegatives(t *testing.T) {
	for _, c := range []PipelineConfig{{MaxBatch: -1}, {MaxBatch: 8, Linger: -time.Millisecond}, {MaxBatch: 8, InFlight: -1}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	for _, c := range []PipelineConfig{{}, {MaxBatch: 1}, {MaxBatch: 64, Linger: time.Millisecond}, {MaxBatch: 64, InFlight: 4}} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if (PipelineConfig{MaxBatch: 1}).Enabled() || !(PipelineConfig{MaxBatch: 2}).Enabled() {
		t.Error("Enabled: batching starts at two calls a pipeline")
	}
}

// clientLikeProduction and clusterLikeProduction are clients as
// config.Redis.Client builds them (which this package's tests cannot
// import): a 1 s read timeout, no retries.
func clientLikeProduction(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 2 * time.Second, ReadTimeout: time.Second,
		WriteTimeout: time.Second, PoolSize: 128, MaxRetries: -1})
}

func clusterLikeProduction(addrs []string) *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DialTimeout: 2 * time.Second, ReadTimeout: time.Second,
		WriteTimeout: time.Second, PoolSize: 128, MaxRetries: -1})
}
