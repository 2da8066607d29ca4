package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Chaos settings: FLASHSALE_CHAOS_ROUNDS (default 3), FLASHSALE_CHAOS_SEED
// (replays a run's schedule; a run prints its seed), and
// FLASHSALE_CHAOS_STEAL_FAULTS=0, which keeps faults off the calls of a
// steal (the probes on other shards and the quota calls on the home shard);
// by default they count and take faults too, as a lost reply there is
// resolved on the shard it went to.
const (
	envChaosRounds      = "FLASHSALE_CHAOS_ROUNDS"
	envChaosSeed        = "FLASHSALE_CHAOS_SEED"
	envChaosStealFaults = "FLASHSALE_CHAOS_STEAL_FAULTS"
)

// TestChaos: rounds of a buyer storm with retries, cancels, checkouts and
// steals, sent in an order drawn from the seed, through a client built as the
// processes build theirs, with one fault landed at a script call drawn from
// the seed: proxy latency below the read timeout, a reply-swallowing proxy, a
// connection reset, DEBUG SLEEP or CLIENT PAUSE past the read timeout. After
// each round the sale quiesces (every reservation expires and is swept) and
// I1-I7 are checked. A replayed seed sends the same operations, in the same
// order, with the same fault at the same call, and the engine draws the same
// shards to probe when it steals (Config.Rand, seeded from the round).
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("a storm per round")
	}
	rounds := 3
	if s := os.Getenv(envChaosRounds); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive integer", envChaosRounds, s)
		}
		rounds = n
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envChaosSeed); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", envChaosSeed, s)
		}
		seed = n
	}
	stealFaults := os.Getenv(envChaosStealFaults) != "0"
	t.Logf("chaos seed %d, %d rounds (%s=%d replays the schedule)", seed, rounds, envChaosSeed, seed)

	r := testharness.RedisT(t)
	proxy := testharness.FaultProxyT(t, r.Addr())
	admin := redis.NewClient(&redis.Options{Addr: r.Addr(), ReadTimeout: 30 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = admin.Close() })
	for round := range rounds {
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		fault := chaosFaults[rng.IntN(len(chaosFaults))]
		t.Run(fmt.Sprintf("round-%d-%s", round, fault.name), func(t *testing.T) {
			chaosRound(t, rng, fmt.Sprintf("chaos-%d-%d", seed, round), fault, stealFaults, r, proxy, admin)
		})
	}
}

const (
	chaosBuyers  = 30
	chaosUnits   = 12 // 3 per shard: home shards sell out and buyers steal
	chaosOps     = 90
	chaosRetries = 3
	chaosTTL     = 2 * time.Second
)

func chaosRound(t *testing.T, rng *rand.Rand, campaign string, fault chaosFault, stealFaults bool, r *testharness.Redis, proxy *testharness.FaultProxy, admin *redis.Client) {
	ctx := context.Background()
	rdb := config.Redis{Mode: config.RedisStandalone, Addresses: []string{proxy.Addr()}}.Client()
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &chaosHook{at: int64(rng.IntN(chaosOps)), steal: stealFaults}
	stock.AddHook(rdb, hook)
	// The seed names the campaign, so a replay has the same home shards, and
	// seeds the engine's steal draws.
	f := newFixture(t, rdb, func(c *fixtureConfig) { c.CampaignID = campaign }, withAllocation(chaosUnits), withShards(4), withSteal(2), withMaxPerUser(1),
		withTTL(chaosTTL, 0), withClaimSlack(time.Second), withSettleStuckAfter(time.Second),
		withRand(rand.NewPCG(rng.Uint64(), rng.Uint64())))
	hook.mu.Lock()
	hook.inject = func() (func() error, error) { return fault.inject(ctx, r.Addr(), proxy, admin) }
	hook.mu.Unlock()
	hook.n.Store(0) // the storm's calls count, not the seeding's
	t.Logf("fault %s at script call %d", fault.name, hook.at)

	type held struct{ user, id string }
	var (
		holding = map[string]string{}          // user -> reservation id acknowledged and not cancelled
		ids     = map[string]map[string]bool{} // user/request -> reservation ids acknowledged
		acked   = map[string]bool{}            // every id acknowledged
		nextReq = map[string]int{}             // user -> request number
		paid    []held
		errs    int // calls that failed (the fault's mark)
	)
	for op := range chaosOps {
		user := fmt.Sprintf("b%d", rng.IntN(chaosBuyers))
		choice := rng.IntN(10)
		switch {
		case choice < 6 || holding[user] == "":
			req := fmt.Sprintf("%s-r%d", user, nextReq[user])
			for try := 0; try <= chaosRetries; try++ {
				res, err := f.e.Reserve(ctx, user, req, 1)
				if err != nil {
					errs++
				}
				if err != nil || res.Outcome == engine.OutcomeBusy {
					continue // the same request again, as a client told 503 does
				}
				if res.Outcome == engine.OutcomeReserved || res.Outcome == engine.OutcomeReplayed {
					k := user + "/" + req
					if ids[k] == nil {
						ids[k] = map[string]bool{}
					}
					ids[k][res.Reservation.ID] = true
					acked[res.Reservation.ID] = true
					holding[user] = res.Reservation.ID
				}
				break
			}
			if rng.IntN(3) == 0 {
				nextReq[user]++
			}
		case choice < 8:
			if res, err := f.e.Cancel(ctx, user, holding[user]); err == nil && res.Outcome == ledger.CancelCancelled {
				delete(holding, user)
				nextReq[user]++
			}
		default:
			id := holding[user]
			if res, err := f.e.Checkout(ctx, user, id, "pay-"+id); err == nil && res.Outcome == ledger.CheckoutCommitted {
				paid = append(paid, held{user, id})
			}
		}
		if err := hook.end(); err != nil {
			t.Fatalf("op %d: ending the fault: %v", op, err)
		}
		chaosPerUser(t, f) // I5 at every step
	}
	if !hook.fired.Load() {
		t.Logf("the round made fewer than %d script calls: no fault landed", hook.at+1)
	}

	// I7: a checkout after expiry never commits.
	var late string
	for user, id := range holding {
		if o, err := f.l.GetOrder(ctx, f.e.Config().CampaignID, id); err == nil && o.Status == ledger.StatusPending {
			late = id
			testharness.Eventually(t, time.Minute, "the reservation to expire", func() bool {
				now, err := f.e.Store().Now(ctx)
				return err == nil && now.After(o.ExpiresAt)
			})
			if res, err := f.e.Checkout(ctx, user, id, "pay-late"); err == nil && res.Outcome == ledger.CheckoutCommitted {
				t.Fatalf("I7 violated: %s committed after its expiry", id)
			}
			break
		}
	}

	// Quiescence: every reservation expired and released, every claim reaped.
	testharness.Eventually(t, 2*time.Minute, "the sale to quiesce", func() bool {
		if _, err := f.e.Sweep(ctx); err != nil {
			return false
		}
		c, err := f.e.Counts(ctx)
		if err != nil || c.Reserved != 0 {
			return false
		}
		n, err := f.rdb.ZCard(ctx, f.e.Store().Keys(0).Claims()).Result()
		for i := 1; err == nil && n == 0 && i < f.e.Store().Shards(); i++ {
			n, err = f.rdb.ZCard(ctx, f.e.Store().Keys(i).Claims()).Result()
		}
		return err == nil && n == 0
	})
	c := f.assertConserved() // I1, I2, I6 (a unit released twice breaks conservation)
	chaosPerUser(t, f)
	// I3: every acknowledgement has its ledger row.
	for id := range acked {
		if _, err := f.l.GetOrder(ctx, f.e.Config().CampaignID, id); err != nil {
			t.Errorf("I3 violated: acknowledged %s has no ledger row: %v", id, err)
		}
	}
	// I4: one request, at most one reservation.
	for k, set := range ids {
		if len(set) > 1 {
			t.Errorf("I4 violated: request %s got %d reservations: %v", k, len(set), set)
		}
	}
	for _, p := range paid {
		if o, err := f.l.GetOrder(ctx, f.e.Config().CampaignID, p.id); err != nil || o.Status != ledger.StatusCommitted {
			t.Errorf("paid %s: %+v %v", p.id, o, err)
		}
	}
	t.Logf("sold %d of %d, %d acknowledged, %d reserve calls failed, late checkout of %q refused", c.Sold, c.Allocation, len(acked), errs, late)
}

// chaosPerUser checks I5 in the ledger: no buyer holds more than maxPerUser.
func chaosPerUser(t *testing.T, f *fixture) {
	t.Helper()
	rows, err := f.l.Pool().Query(context.Background(),
		`SELECT user_id, sum(quantity) FROM flashsale_orders WHERE campaign_id = $1 AND status IN ('PENDING', 'COMMITTED') GROUP BY user_id HAVING sum(quantity) > $2`,
		f.cfg.CampaignID, f.cfg.MaxPerUser)
	if err != nil {
		t.Fatal(err)
	}
	var user string
	var units int64
	if _, err := pgx.ForEachRow(rows, []any{&user, &units}, func() error {
		t.Errorf("I5 violated: %s holds %d units, at most %d", user, units, f.cfg.MaxPerUser)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		t.FailNow()
	}
}

// chaosFault lands one fault; the function it returns ends it.
type chaosFault struct {
	name   string
	inject func(ctx context.Context, addr string, p *testharness.FaultProxy, admin *redis.Client) (func() error, error)
}

func proxyChaos(name string, add func(p *testharness.FaultProxy) (string, error)) chaosFault {
	return chaosFault{name: name, inject: func(_ context.Context, _ string, p *testharness.FaultProxy, _ *redis.Client) (func() error, error) {
		if _, err := add(p); err != nil {
			return nil, err
		}
		return func() error { p.RemoveAll(); return nil }, nil
	}}
}

var chaosFaults = []chaosFault{
	proxyChaos("latency", func(p *testharness.FaultProxy) (string, error) {
		return p.Latency(testharness.Downstream, 300*time.Millisecond) // below the read timeout
	}),
	proxyChaos("swallow", func(p *testharness.FaultProxy) (string, error) { return p.Timeout(testharness.Downstream, 0) }),
	proxyChaos("reset", func(p *testharness.FaultProxy) (string, error) { return p.ResetPeer(testharness.Downstream, 0) }),
	{name: "debug-sleep", inject: func(ctx context.Context, addr string, _ *testharness.FaultProxy, admin *redis.Client) (func() error, error) {
		probe := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 50 * time.Millisecond, MaxRetries: -1, PoolSize: 1})
		defer probe.Close()
		if err := testharness.PingAwake(ctx, probe); err != nil { // connected before the sleep
			return nil, err
		}
		done := make(chan error, 1)
		go func() { done <- admin.Do(ctx, "DEBUG", "SLEEP", "2").Err() }()
		for {
			err := probe.Ping(ctx).Err()
			var ne interface{ Timeout() bool }
			if errors.As(err, &ne) && ne.Timeout() {
				return func() error { return <-done }, nil // asleep
			}
			if err != nil {
				return nil, err
			}
		}
	}},
	{name: "client-pause", inject: func(ctx context.Context, _ string, _ *testharness.FaultProxy, admin *redis.Client) (func() error, error) {
		if err := admin.Do(ctx, "CLIENT", "PAUSE", "2000", "WRITE").Err(); err != nil {
			return nil, err
		}
		return func() error { return admin.Do(ctx, "CLIENT", "UNPAUSE").Err() }, nil
	}},
}

// chaosHook lands the fault when the at-th script call is about to be sent;
// unless steal is set, steal calls (reserve in steal mode, quota calls)
// neither count nor take the fault.
type chaosHook struct {
	at     int64
	steal  bool
	inject func() (func() error, error)

	n     atomic.Int64
	fired atomic.Bool
	mu    sync.Mutex
	stop  func() error
	err   error
}

func (h *chaosHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *chaosHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *chaosHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); (name == "evalsha" || name == "eval") && (h.steal || !stealCall(cmd)) {
			if h.n.Add(1)-1 == h.at && h.ready() && h.fired.CompareAndSwap(false, true) {
				h.mu.Lock()
				inject := h.inject
				h.mu.Unlock()
				stop, err := inject()
				h.mu.Lock()
				h.stop, h.err = stop, err
				h.mu.Unlock()
			}
		}
		return next(ctx, cmd)
	}
}

// stealCall: a reserve in steal mode (ARGV[8]) or a quota call, by its args:
// EVALSHA sha numkeys keys... args...
func stealCall(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 3 {
		return false
	}
	nkeys, _ := strconv.Atoi(fmt.Sprint(args[2]))
	argv := args[3+nkeys:]
	switch {
	case nkeys == 6 && len(argv) >= 8: // reserve
		return fmt.Sprint(argv[7]) == string(stock.ModeSteal)
	case nkeys == 2 && len(argv) >= 1: // quota (users, claims)
		switch fmt.Sprint(argv[0]) {
		case "confirm", "unclaim", stock.QuotaRelease, stock.QuotaForget:
			return true
		}
	}
	return false
}

func (h *chaosHook) ready() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.inject != nil }

// end ends a fault that landed during the last operation.
func (h *chaosHook) end() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		err := h.err
		h.err = nil
		return err
	}
	if h.stop == nil {
		return nil
	}
	stop := h.stop
	h.stop = nil
	return stop()
}
