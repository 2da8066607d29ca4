package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

const shortTTL = 1500 * time.Millisecond

// reserveMany makes n reservations by n users and returns their ids.
func reserveMany(t *testing.T, f *fixture, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	for i := range n {
		r := f.reserve(fmt.Sprintf("%s-%d", prefix, i), "r", 1)
		if r.Outcome != engine.OutcomeReserved {
			t.Fatalf("reserve %d: %s", i, r.Outcome)
		}
		ids = append(ids, r.Reservation.ID)
	}
	return ids
}

// sellOutShard reserves one unit for each of as many buyers homed on shard as
// it takes to empty it, and returns how many it took: the next buyer homed
// there has to steal.
func (f *fixture) sellOutShard(shard int) int {
	f.t.Helper()
	n := 0
	for i := 0; f.counts().Shards[shard].Available > 0; i++ {
		if u := fmt.Sprintf("filler-%d", i); stock.HomeShard(u, f.cfg.Shards) == shard {
			f.reserve(u, "r", 1)
			n++
		}
	}
	return n
}

// placeUnrecorded places one unit for user's request "r" on its home
// shard, in Redis only, for ttl: a reserve process that died after the
// Redis step, before the ledger row. It returns the request's key and the
// placement.
func (f *fixture) placeUnrecorded(user string, ttl time.Duration) (string, stock.ShardResult) {
	f.t.Helper()
	key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, "r")
	home := stock.HomeShard(user, f.cfg.Shards)
	r, err := f.e.Store().Reserve(context.Background(), stock.ReserveRequest{Shard: home, Home: home, Mode: stock.ModeHome,
		User: user, Key: key, Quantity: 1, MaxPerUser: f.cfg.MaxPerUser, TTL: ttl})
	if err != nil || r.Code != stock.Reserved {
		f.t.Fatalf("placement of %s: %+v %v", user, r, err)
	}
	return key, r
}

func orderStatus(t *testing.T, f *fixture, id string) ledger.Status {
	t.Helper()
	o, err := f.l.GetOrder(context.Background(), f.e.Config().CampaignID, id)
	if err != nil {
		t.Fatalf("order %s: %v", id, err)
	}
	return o.Status
}

func TestSweeperReleasesExpired(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(30), withTTL(shortTTL, 200*time.Millisecond))
		ctx := context.Background()
		ids := reserveMany(t, f, "u", 10)
		if _, err := f.e.Checkout(ctx, "u-0", ids[0], "pay"); err != nil {
			t.Fatal(err)
		}
		// Before expiry + grace nothing is released.
		if st, err := f.e.Sweep(ctx); err != nil || st.Released != 0 {
			t.Fatalf("early sweep: %+v %v", st, err)
		}
		time.Sleep(shortTTL + 300*time.Millisecond)
		st := f.sweepUntilQuiet()
		if st.Released != 9 {
			t.Fatalf("released %d, want 9", st.Released)
		}
		for _, id := range ids[1:] {
			if s := orderStatus(t, f, id); s != ledger.StatusCancelledBySweeper {
				t.Fatalf("%s: %s", id, s)
			}
		}
		if s := orderStatus(t, f, ids[0]); s != ledger.StatusCommitted {
			t.Fatalf("committed order became %s", s)
		}
		c := f.assertConserved()
		if c.Sold != 1 || c.Available != 29 {
			t.Fatalf("counts %+v", c)
		}
		// Released users may buy again (their quota came back).
		if r := f.reserve("u-1", "r2", 1); r.Outcome != engine.OutcomeReserved {
			t.Fatalf("after release: %s", r.Outcome)
		}
	})
}

// Failure matrix: the API died after the Lua call and before the SQL write. The
// sweeper finds no ledger row, records ABANDONED, then releases.
// The sweeper's engine has no id secret (its pods do not get the admission
// key): it cannot reserve, and everything else it does works on the
// reservations a keyed engine made.
func TestEngineWithoutIDSecret(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(10), withTTL(shortTTL, 0))
		ctx := context.Background()
		cfg := f.cfg
		cfg.IDSecret = nil
		g, err := engine.New(withTestPipeline(cfg), rdb, f.l, ledger.MaterializerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if r, err := g.Reserve(ctx, "u-x", "r", 1); !errors.Is(err, engine.ErrNoIDSecret) {
			t.Fatalf("reserve without a secret: %+v %v", r, err)
		}
		if c := f.counts(); c.Available != 10 || c.Reserved != 0 {
			t.Fatalf("a refused reserve changed the counts: %+v", c)
		}
		ids := reserveMany(t, f, "k", 3)
		if r, err := g.Checkout(ctx, "k-0", ids[0], "pay"); err != nil || r.Outcome != ledger.CheckoutCommitted {
			t.Fatalf("checkout %+v %v", r, err)
		}
		if r, err := g.Cancel(ctx, "k-1", ids[1]); err != nil || r.Outcome != ledger.CancelCancelled {
			t.Fatalf("cancel %+v %v", r, err)
		}
		time.Sleep(shortTTL + 100*time.Millisecond)
		var released int
		for range 20 {
			st, err := g.Sweep(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if released += st.Released; released >= 1 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if released != 1 || orderStatus(t, f, ids[2]) != ledger.StatusCancelledBySweeper {
			t.Fatalf("released %d, %s", released, orderStatus(t, f, ids[2]))
		}
		if c := f.assertConserved(); c.Sold != 1 || c.Available != 9 {
			t.Fatalf("counts %+v", c)
		}
	})
	for _, short := range [][]byte{[]byte("short"), nil} {
		cfg := engine.Config{CampaignID: "c", Shards: 1, MaxPerUser: 1, TTL: time.Minute, IDSecret: short}
		if err := cfg.Validate(); (err != nil) != (short != nil) {
			t.Fatalf("id secret %q: %v", short, err)
		}
	}
}

func TestAPIDiedBetweenRedisAndSQL(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(10), withTTL(shortTTL, 0))
		ctx := context.Background()
		key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, "ivan", "r")
		home := stock.HomeShard("ivan", f.cfg.Shards)
		r, err := f.e.Store().Reserve(ctx, stock.ReserveRequest{
			Shard: home, Home: home, Mode: stock.ModeHome, User: "ivan", Key: key, Quantity: 1,
			MaxPerUser: 1, TTL: shortTTL,
		})
		if err != nil || r.Code != stock.Reserved {
			t.Fatalf("%+v %v", r, err)
		}
		if c := f.counts(); c.Available != 9 || c.Reserved != 1 {
			t.Fatalf("counts %+v", c)
		}
		time.Sleep(shortTTL + 100*time.Millisecond)
		st := f.sweepUntilQuiet()
		if st.Abandoned != 1 || st.Released != 1 {
			t.Fatalf("sweep %+v", st)
		}
		if s := orderStatus(t, f, stock.FormatID(home, key)); s != ledger.StatusAbandoned {
			t.Fatalf("status %s, want ABANDONED", s)
		}
		c := f.counts()
		if c.Available != 10 || c.Reserved != 0 {
			t.Fatalf("counts %+v", c)
		}
		// A retry of the same request now learns its reservation is gone.
		if r := f.reserve("ivan", "r", 1); r.Outcome != engine.OutcomeExpired {
			t.Fatalf("retry after abandonment: %s", r.Outcome)
		}
		if c := f.counts(); c.Available != 10 {
			t.Fatalf("the retry kept a unit: %+v", c)
		}
	})
}

// A reservation whose request lost the script's answer (a Redis stall, a
// retried call) or died before its ledger row: a retry of the same request
// answers busy while the original could still write the row, and once the
// engine has seen it stuck for SettleStuckAfter it settles it as the sweeper
// would, without waiting for the TTL: ABANDONED, the unit and the buyer's
// quota back at once.
func TestReplayOfAStuckReservationSettlesIt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const after = 1500 * time.Millisecond
		f := newFixture(t, rdb, withAllocation(10), withTTL(time.Hour, 0), withSettleStuckAfter(after))
		ctx := context.Background()
		place := func(user string) string {
			key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, "r")
			home := stock.HomeShard(user, f.cfg.Shards)
			r, err := f.e.Store().Reserve(ctx, stock.ReserveRequest{
				Shard: home, Home: home, Mode: stock.ModeClaim, User: user, Key: key, Quantity: 1,
				MaxPerUser: 1, TTL: f.cfg.TTL,
			})
			if err != nil || r.Code != stock.Reserved {
				t.Fatalf("%+v %v", r, err)
			}
			return stock.FormatID(home, key)
		}
		young := place("yuri")
		stuck := place("sven")
		for _, user := range []string{"yuri", "sven"} {
			if r := f.reserve(user, "r", 1); r.Outcome != engine.OutcomeBusy {
				t.Fatalf("first retry of %s's reservation without its row: %s, want BUSY", user, r.Outcome)
			}
		}
		time.Sleep(after)
		if _, err := f.l.GetOrder(ctx, f.e.Config().CampaignID, young); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("the young one was settled: %v", err)
		}
		// Yuri's reservation is given back without a replay seeing it (its
		// write failed), and the same request places a new one: that one is
		// young, whatever the engine saw under the same id before.
		home := stock.HomeShard("yuri", f.cfg.Shards)
		if _, err := f.e.Store().Release(ctx, home, stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, "yuri", "r")); err != nil {
			t.Fatal(err)
		}
		if again := place("yuri"); again != young {
			t.Fatalf("id %s, then %s", young, again)
		}
		if r := f.reserve("yuri", "r", 1); r.Outcome != engine.OutcomeBusy {
			t.Fatalf("retry of a new reservation under an id seen stuck before: %s, want BUSY", r.Outcome)
		}
		if r := f.reserve("sven", "r", 1); r.Outcome != engine.OutcomeExpired {
			t.Fatalf("retry of a stuck reservation: %s, want EXPIRED", r.Outcome)
		}
		if s := orderStatus(t, f, stuck); s != ledger.StatusAbandoned {
			t.Fatalf("status %s, want ABANDONED", s)
		}
		if c := f.counts(); c.Available != 9 || c.Reserved != 1 {
			t.Fatalf("the stuck unit did not come back: %+v", c)
		}
		if r := f.reserve("sven", "r2", 1); r.Outcome != engine.OutcomeReserved {
			t.Fatalf("a new request of the same buyer: %s, want RESERVED (the quota is back)", r.Outcome)
		}
		if c := f.counts(); c.Available != 8 || c.Reserved != 2 || c.Pending != 1 || !c.Conserved() {
			t.Fatalf("counts %+v (the young reservation still waits for its row or the sweeper)", c)
		}
	})
}

// Failure matrix: a sweeper died between its SQL cancel and the Redis release. The
// next pass finds CANCELLED_BY_SWEEPER and still releases.
func TestSweeperDiedBetweenSQLAndRedis(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(10), withTTL(shortTTL, 0))
		ctx := context.Background()
		ids := reserveMany(t, f, "j", 3)
		time.Sleep(shortTTL + 100*time.Millisecond)
		got, err := f.l.CancelExpired(ctx, f.cfg.CampaignID, ids, 0)
		if err != nil || len(got) != 3 {
			t.Fatalf("%v %v", got, err)
		}
		if c := f.counts(); c.Available != 7 {
			t.Fatalf("units came back without a release: %+v", c)
		}
		if st := f.sweepUntilQuiet(); st.Released != 3 {
			t.Fatalf("sweep %+v", st)
		}
		f.assertConserved()
	})
}

// I6 / failure matrix: two (here four) sweepers on the same expired reservations
// release each unit once.
func TestConcurrentSweepersReleaseOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(300), withShards(6), withTTL(shortTTL, 0))
		reserveMany(t, f, "k", 200)
		time.Sleep(shortTTL + 100*time.Millisecond)
		var wg sync.WaitGroup
		var released counter
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := f.e.Sweep(context.Background())
				if err != nil {
					t.Error(err)
				}
				released.n.Add(int64(st.Released))
			}()
		}
		wg.Wait()
		f.sweepUntilQuiet()
		if released.value() != 200 {
			t.Fatalf("%d releases counted for 200 reservations", released.value())
		}
		c := f.assertConserved()
		if c.Available != 300 {
			t.Fatalf("available %d, want 300", c.Available)
		}
	})
}

// I7: a payment after expiry never commits; it is recorded for voiding.
func TestPaymentAfterExpiry(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withAllocation(5), withTTL(shortTTL, time.Minute))
	ctx := context.Background()
	r := f.reserve("lena", "r", 1)
	time.Sleep(shortTTL + 100*time.Millisecond)
	co, err := f.e.Checkout(ctx, "lena", r.Reservation.ID, "pay-late")
	if err != nil || co.Outcome != ledger.CheckoutExpired {
		t.Fatalf("late checkout: %v %v", co.Outcome, err)
	}
	if s := orderStatus(t, f, r.Reservation.ID); s == ledger.StatusCommitted {
		t.Fatal("I7 violated: committed after expiry")
	}
	var n int
	if err := f.l.Pool().QueryRow(ctx, `SELECT count(*) FROM flashsale_late_payments WHERE reservation_id=$1 AND payment_token='pay-late'`, r.Reservation.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("late payment rows %d, %v", n, err)
	}
	// Within the grace period the unit is still held, not yet released.
	if c := f.counts(); c.Reserved != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// Failure matrix: checkout racing the sweeper at the expiry edge. Each reservation
// ends either committed (and stays sold) or released (and its payment refused),
// never both.
func TestCheckoutRacingSweeper(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const ttl = 300 * time.Millisecond
		f := newFixture(t, rdb, withAllocation(120), withShards(4), withTTL(ttl, 0))
		ctx := context.Background()
		var res []engine.Reservation
		for i := range 100 {
			r := f.reserve(fmt.Sprintf("m-%d", i), "r", 1)
			res = append(res, r.Reservation)
		}
		ids := make([]string, len(res))
		for i, r := range res {
			ids[i] = r.ID
		}
		stop := make(chan struct{})
		var sweeps sync.WaitGroup
		sweeps.Add(1)
		go func() {
			defer sweeps.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := f.e.Sweep(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
		var wg sync.WaitGroup
		committed := make([]bool, len(ids))
		for i, r := range res {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Aim each checkout at its own expiry, from 40 ms before to 10 ms after.
				time.Sleep(time.Until(r.ExpiresAt.Add(time.Duration(i%50-40) * time.Millisecond)))
				co, err := f.e.Checkout(ctx, fmt.Sprintf("m-%d", i), r.ID, "pay")
				if err != nil {
					t.Error(err)
					return
				}
				committed[i] = co.Outcome == ledger.CheckoutCommitted
			}()
		}
		wg.Wait()
		time.Sleep(50 * time.Millisecond)
		close(stop)
		sweeps.Wait()
		f.sweepUntilQuiet()
		var sold int64
		for i, id := range ids {
			s := orderStatus(t, f, id)
			if committed[i] != (s == ledger.StatusCommitted) {
				t.Fatalf("%s: checkout said committed=%v, ledger says %s", id, committed[i], s)
			}
			if s == ledger.StatusCommitted {
				sold++
			} else if s != ledger.StatusCancelledBySweeper {
				t.Fatalf("%s ended %s", id, s)
			}
		}
		c := f.assertConserved()
		if c.Sold != sold || c.Available != 120-sold {
			t.Fatalf("counts %+v, sold %d", c, sold)
		}
		t.Logf("%d of %d committed at the edge", sold, len(ids))
	})
}
