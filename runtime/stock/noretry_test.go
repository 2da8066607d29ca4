package stock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A script whose reply is lost (the server stalled past the client's read
// timeout, the reply was swallowed or the connection reset) has run, or will
// run, exactly once: the clients the processes build (config.Redis.Client)
// never send it again. Under CLIENT PAUSE, at most once: Redis drops a
// paused command whose client hung up. Each script call is stalled when its EVALSHA is sent
// (a hook on the client under test injects the fault then), and the server's
// own count of script runs says how often it ran.
func TestStalledScriptsRunOnce(t *testing.T) {
	r := testharness.RedisT(t)
	proxy := testharness.FaultProxyT(t, r.Addr())
	faults := []faultKind{
		debugSleep, clientPause,
		proxyFault("proxy-timeout", func(p *testharness.FaultProxy) (string, error) { return p.Timeout(testharness.Downstream, 0) }),
		proxyFault("proxy-latency", func(p *testharness.FaultProxy) (string, error) {
			return p.Latency(testharness.Downstream, 1500*time.Millisecond)
		}),
		proxyFault("proxy-reset", func(p *testharness.FaultProxy) (string, error) { return p.ResetPeer(testharness.Downstream, 0) }),
	}
	for _, fk := range faults {
		t.Run(fk.name, func(t *testing.T) {
			addr := r.Addr()
			if fk.proxy != nil {
				addr = proxy.Addr()
			}
			env := newStallEnv(t, config.Redis{Mode: config.RedisStandalone, Addresses: []string{addr}},
				redis.NewClient(&redis.Options{Addr: r.Addr()}), []string{r.Addr()}, fk, proxy)
			runStallCases(t, env)
		})
	}
}

// The same on a Redis Cluster, where go-redis's redirect loop (MaxRedirects)
// re-sends after a timeout whatever MaxRetries says; it still follows MOVED
// (TestScriptFollowsMoved).
func TestStalledScriptsRunOnceOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := testharness.RedisClusterT(t)
	var masters []string
	for _, n := range c.Nodes() {
		masters = append(masters, n.Addr())
	}
	for _, fk := range []faultKind{debugSleep, clientPause} {
		t.Run(fk.name, func(t *testing.T) {
			env := newStallEnv(t, config.Redis{Mode: config.RedisCluster, Addresses: c.Addrs()},
				redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()}), masters, fk, nil)
			runStallCases(t, env)
		})
	}
}

// stallCase is one script call: setup (through an unstalled client) puts the
// shard where the script has work to do, call runs it on the client under
// test, check (optional) reads what it did.
type stallCase struct {
	name  string
	setup func(ctx context.Context, s *stock.Store) error
	call  func(ctx context.Context, s *stock.Store) error
	check func(ctx context.Context, t *testing.T, s *stock.Store)
}

const (
	user, key = "buyer", "req-1"
	epoch     = int64(7)
)

func req(mode stock.Mode) stock.ReserveRequest {
	return stock.ReserveRequest{Shard: 0, Home: 0, Mode: mode, User: user, Key: key, Quantity: 1, MaxPerUser: 1, TTL: time.Minute}
}

func seed(units int64) func(ctx context.Context, s *stock.Store) error {
	return func(ctx context.Context, s *stock.Store) error {
		for i := range s.Shards() {
			if _, err := s.Seed(ctx, i, units, 1, stock.StateOpen, 0); err != nil {
				return err
			}
		}
		return nil
	}
}

// then runs the setup steps in order.
func then(steps ...func(ctx context.Context, s *stock.Store) error) func(ctx context.Context, s *stock.Store) error {
	return func(ctx context.Context, s *stock.Store) error {
		for _, step := range steps {
			if err := step(ctx, s); err != nil {
				return err
			}
		}
		return nil
	}
}

// payMarkedAt is the time of the paying mark a setup made: dropping it names it.
var payMarkedAt int64

// claimStamp is the stamp of the last claim a setup's reserve made: the
// quota operations on a claim name it.
var claimStamp string

func reserved(want stock.Code, mode stock.Mode) func(ctx context.Context, s *stock.Store) error {
	return func(ctx context.Context, s *stock.Store) error {
		res, err := s.Reserve(ctx, req(mode))
		if err == nil && res.Code != want {
			err = fmt.Errorf("setup reserve: %v, want %v", res.Code, want)
		}
		if res.Code == stock.Claimed {
			claimStamp = res.Status
		}
		return err
	}
}

// placedExpiry is the expiry of the stolen reservation the quota tests
// place on shard 1 (confirm) and give back (release).
var placedExpiry = time.Now().Add(time.Hour).UnixMilli()

func quota(op string) func(ctx context.Context, s *stock.Store) error {
	return func(ctx context.Context, s *stock.Store) error {
		var err error
		switch op {
		case "confirm":
			_, err = s.ConfirmClaim(ctx, 0, key, claimStamp, 1, placedExpiry)
		case "unclaim":
			_, err = s.Unclaim(ctx, 0, key, claimStamp)
		default:
			_, err = s.Quota(ctx, 0, op, user, key, 1, 1, placedExpiry)
		}
		return err
	}
}

func rebuildBegin(ctx context.Context, s *stock.Store) error { return s.RebuildBegin(ctx, 0, epoch) }

func metaField(ctx context.Context, t *testing.T, s *stock.Store, field string) string {
	t.Helper()
	v, err := s.Client().HGet(ctx, s.Keys(0).Meta(), field).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return v
}

var stallCases = []stallCase{
	{name: "reserve", setup: seed(5),
		call: func(ctx context.Context, s *stock.Store) error {
			_, err := s.Reserve(ctx, req(stock.ModeHome))
			return err
		},
		check: func(ctx context.Context, t *testing.T, s *stock.Store) {
			if st, err := s.State(ctx); err != nil || st[0].Available != 4 || st[0].Reserved != 1 {
				t.Errorf("after one reserve: %+v %v; want 4 available, 1 reserved", st, err)
			}
		}},
	{name: "reserve-claim", setup: seed(0),
		call: func(ctx context.Context, s *stock.Store) error {
			_, err := s.Reserve(ctx, req(stock.ModeClaim))
			return err
		},
		check: func(ctx context.Context, t *testing.T, s *stock.Store) {
			// Run once, the claim stands and the same request goes on to steal
			// (a second run would answer BUSY to the caller).
			if n, err := s.Client().HGet(ctx, s.Keys(0).Users(), user).Result(); err != nil || n != "1" {
				t.Errorf("claimed quota: %q %v; want 1", n, err)
			}
		}},
	{name: "quota-confirm", setup: then(seed(0), reserved(stock.Claimed, stock.ModeClaim)), call: quota("confirm")},
	{name: "quota-unclaim", setup: then(seed(0), reserved(stock.Claimed, stock.ModeClaim)), call: quota("unclaim")},
	{name: "quota-release", setup: then(seed(0), reserved(stock.Claimed, stock.ModeClaim), quota("confirm")), call: quota(stock.QuotaRelease)},
	{name: "quota-reap", setup: then(seed(0), reserved(stock.Claimed, stock.ModeClaim)),
		call: func(ctx context.Context, s *stock.Store) error {
			_, _, err := s.ReapClaim(ctx, 0, key, time.Now().Add(time.Hour))
			return err
		}},
	{name: "resolve", setup: seed(0),
		call: func(ctx context.Context, s *stock.Store) error { _, err := s.Resolve(ctx, 0, key, "a1"); return err },
		check: func(ctx context.Context, t *testing.T, s *stock.Store) {
			// The fence it wrote stops the attempt it names.
			r := req(stock.ModeClaim)
			r.Attempt = "a1"
			if res, err := s.Reserve(ctx, r); err != nil || res.Code != stock.Busy || res.Status != "FENCED" {
				t.Errorf("the fenced attempt: %+v %v; want BUSY FENCED", res, err)
			}
		}},
	{name: "release", setup: then(seed(5), reserved(stock.Reserved, stock.ModeHome)),
		call: func(ctx context.Context, s *stock.Store) error { _, err := s.Release(ctx, 0, key); return err }},
	{name: "cancel", setup: then(seed(5), reserved(stock.Reserved, stock.ModeHome)),
		call: func(ctx context.Context, s *stock.Store) error { _, err := s.Cancel(ctx, 0, key, user); return err }},
	{name: "commit", setup: then(seed(5), reserved(stock.Reserved, stock.ModeHome)),
		call: func(ctx context.Context, s *stock.Store) error { _, err := s.MarkCommitted(ctx, 0, key); return err }},
	{name: "pay-mark", setup: then(seed(5), reserved(stock.Reserved, stock.ModeHome)),
		call: func(ctx context.Context, s *stock.Store) error { _, err := s.MarkPaying(ctx, 0, key, user); return err }},
	{name: "pay-drop", setup: then(seed(5), reserved(stock.Reserved, stock.ModeHome), func(ctx context.Context, s *stock.Store) (err error) {
		payMarkedAt, err = s.MarkPaying(ctx, 0, key, user)
		return err
	}),
		call: func(ctx context.Context, s *stock.Store) error {
			_, err := s.DropPaying(ctx, 0, key, payMarkedAt)
			return err
		}},
	{name: "seed", setup: func(context.Context, *stock.Store) error { return nil },
		call: func(ctx context.Context, s *stock.Store) error {
			_, err := s.Seed(ctx, 0, 5, 1, stock.StateOpen, 0)
			return err
		}},
	{name: "gate", setup: func(ctx context.Context, s *stock.Store) error {
		_, err := s.Seed(ctx, 0, 5, 1, stock.StateNotStarted, 0)
		return err
	},
		// Opening goes shard by shard and stops at the first failure: one call.
		call: func(ctx context.Context, s *stock.Store) error {
			_, err := s.SetGate(ctx, stock.StateOpen, 0)
			return err
		}},
	{name: "stamp", setup: then(seed(5), func(ctx context.Context, s *stock.Store) error {
		return s.Client().HDel(ctx, s.Keys(0).Meta(), "srv").Err()
	}), call: func(ctx context.Context, s *stock.Store) error { _, err := s.Stamp(ctx); return err }},
	{name: "adjust", setup: seed(5),
		call: func(ctx context.Context, s *stock.Store) error { _, err := s.Adjust(ctx, 0, 0, 1, 3, 3, 0); return err }},
	{name: "withdraw", setup: seed(5),
		call: func(ctx context.Context, s *stock.Store) error { _, _, err := s.Withdraw(ctx, 0, 0, 2); return err }},
	{name: "rebuild-begin", setup: seed(5), call: rebuildBegin},
	{name: "rebuild-restore", setup: then(seed(5), rebuildBegin),
		call: func(ctx context.Context, s *stock.Store) error {
			return s.RebuildRestore(ctx, 0, epoch, []stock.Reservation{{
				Key: key, User: user, Quantity: 1, Status: stock.ResReserved,
				ExpiryMs: time.Now().Add(10 * time.Minute).UnixMilli(), Epoch: epoch, Home: 0,
			}})
		},
		check: func(ctx context.Context, t *testing.T, s *stock.Store) {
			if got := metaField(ctx, t, s, "rsv"); got != "1" {
				t.Errorf("reserved units after restoring one reservation: %q, want 1", got)
			}
		}},
	{name: "rebuild-users", setup: then(seed(5), rebuildBegin),
		call: func(ctx context.Context, s *stock.Store) error {
			return s.RebuildUsers(ctx, 0, epoch, []string{user, "1"})
		}},
	{name: "rebuild-finish", setup: then(seed(5), rebuildBegin),
		call: func(ctx context.Context, s *stock.Store) error {
			return s.RebuildFinish(ctx, 0, 5, epoch, stock.StateOpen, 5, 0)
		}},
}

// stallEnv is one client under test with one kind of fault.
type stallEnv struct {
	cfg     config.Redis
	rdb     redis.UniversalClient // under test, built by config
	admin   redis.UniversalClient // setup and checks, never stalled
	servers []string              // every server (master) a script may run on
	fault   faultKind
	proxy   *testharness.FaultProxy
	hook    *stallHook
}

func newStallEnv(t *testing.T, cfg config.Redis, admin redis.UniversalClient, servers []string, fk faultKind, proxy *testharness.FaultProxy) *stallEnv {
	t.Helper()
	e := &stallEnv{cfg: cfg, rdb: cfg.Client(), admin: admin, servers: servers, fault: fk, proxy: proxy}
	t.Cleanup(func() { _ = e.rdb.Close(); _ = e.admin.Close() })
	e.hook = &stallHook{env: e}
	stock.AddHook(e.rdb, e.hook)
	return e
}

func runStallCases(t *testing.T, e *stallEnv) {
	if err := loadScripts(e.servers); err != nil {
		t.Fatal(err)
	}
	for i, c := range stallCases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			campaign := fmt.Sprintf("nr-%s-%s-%d", e.cfg.Mode, e.fault.name, i)
			admin := stock.New(e.admin, campaign, 2)
			if err := c.setup(ctx, admin); err != nil {
				t.Fatalf("setup: %v", err)
			}
			for _, addr := range e.servers {
				if err := redisOn(addr).ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.warm(ctx); err != nil {
				t.Fatal(err)
			}
			e.hook.arm()
			err := c.call(ctx, stock.New(e.rdb, campaign, 2))
			restoreErr := e.hook.restore(ctx)
			if restoreErr != nil {
				t.Fatalf("fault: %v", restoreErr)
			}
			if !e.hook.fired() {
				t.Fatal("the call sent no script")
			}
			if e.fault.dropsTimedOut {
				// CLIENT UNPAUSE has run what was paused by the time it answers.
				if runs := scriptRuns(t, e.servers); runs > 1 {
					t.Fatalf("the script ran %d times after one call (the call returned %v)", runs, err)
				}
				if err == nil {
					t.Fatal("the call succeeded: the fault did not cover its script")
				}
				return
			}
			runs := scriptRuns(t, e.servers)
			for deadline := time.Now().Add(30 * time.Second); runs < 1; runs = scriptRuns(t, e.servers) {
				if time.Now().After(deadline) {
					t.Fatalf("the stalled script never ran (the call returned %v)", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if runs != 1 {
				t.Fatalf("the script ran %d times after one call (the call returned %v)", runs, err)
			}
			if err == nil {
				t.Fatal("the call succeeded: the fault did not cover its script")
			}
			if c.check != nil {
				c.check(ctx, t, admin)
			}
		})
	}
}

// warm gives the client under test idle connections to every server, as a
// busy process has: the fault must meet the script, not the handshake (HELLO)
// of a new connection, and a re-send would find a connection ready.
func (e *stallEnv) warm(ctx context.Context) error {
	if c, ok := e.rdb.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, warmPool)
	}
	return warmPool(ctx, e.rdb.(*redis.Client))
}

const warmConns = 4 // more than the re-sends a client would make

func warmPool(ctx context.Context, c *redis.Client) error {
	conns := make([]*redis.Conn, 0, warmConns)
	defer func() {
		for _, cn := range conns {
			_ = cn.Close() // back to the pool, idle
		}
	}()
	// A pooled connection the previous case's fault left dead fails its
	// ping; go-redis drops it on Close and the next Conn dials afresh.
	var err error
	for attempts := 0; len(conns) < warmConns && attempts < 4*warmConns; attempts++ {
		cn := c.Conn()
		if err = cn.Ping(ctx).Err(); err != nil {
			_ = cn.Close()
			continue
		}
		conns = append(conns, cn)
	}
	if len(conns) < warmConns {
		return fmt.Errorf("warming the pool: %d of %d connections answered: %w", len(conns), warmConns, err)
	}
	return nil
}
