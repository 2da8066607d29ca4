package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// scriptTrips counts the round trips that carry calls of one script: calls
// sent alone, and pipelines holding at least one of them (and those calls).
type scriptTrips struct {
	match func(args []any) bool

	mu                      sync.Mutex
	alone, pipelines, piped int
}

func (h *scriptTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd.Args()) {
			h.mu.Lock()
			h.alone++
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *scriptTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			if h.match(cmd.Args()) {
				n++
			}
		}
		if n > 0 {
			h.mu.Lock()
			h.pipelines++
			h.piped += n
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

func (h *scriptTrips) counts() (alone, pipelines, piped int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.alone, h.pipelines, h.piped
}

// expireOnOneShard makes n reservations by n buyers on a one-shard sale and
// waits until they are past expiry and grace.
func expireOnOneShard(t *testing.T, rdb redis.UniversalClient, n int) *fixture {
	t.Helper()
	f := newFixture(t, rdb, withShards(1), withAllocation(int64(n)+10), withTTL(shortTTL, 100*time.Millisecond))
	reserveMany(t, f, "buyer", n)
	time.Sleep(shortTTL + 300*time.Millisecond)
	return f
}

// A sweep releases a batch of expired reservations in pipelines of
// stock.ReleaseBatch calls, not one round trip each: a shard's backlog after
// a sale drains at the rate of pipelines, not of replies. On a server that
// lost its scripts (restarted, failed over) each pipeline goes twice: every
// call is answered NOSCRIPT, without running, and goes again once the
// script is loaded.
func TestSweepSendsReleasesTogether(t *testing.T) {
	for _, b := range backends() {
		for _, flushed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/scripts flushed %v", b.name, flushed), func(t *testing.T) {
				ctx := context.Background()
				rdb, _ := withLostReplies(t, b)
				trips := &scriptTrips{match: isScript(t, "release")}
				stock.AddHook(rdb, trips)
				const n = 100
				f := expireOnOneShard(t, rdb, n)
				sends := 1
				if flushed {
					sends = 2
					if err := rdb.ScriptFlush(ctx).Err(); err != nil {
						t.Fatal(err)
					}
				} else if err := rdb.ScriptLoad(ctx, scriptSource(t, "release")).Err(); err != nil {
					t.Fatal(err)
				}
				st, err := f.e.Sweep(ctx)
				if err != nil || st.Released != n {
					t.Fatalf("sweep: %+v %v, want %d released", st, err, n)
				}
				alone, pipelines, piped := trips.counts()
				want := sends * (n + stock.ReleaseBatch - 1) / stock.ReleaseBatch
				if alone != 0 || piped != sends*n || pipelines != want {
					t.Fatalf("release calls: %d alone, %d in %d pipelines; want 0 alone, %d in %d pipelines",
						alone, piped, pipelines, sends*n, want)
				}
				if c := f.assertConserved(); c.Available != n+10 || c.Reserved != 0 {
					t.Fatalf("after the sweep: %+v", c)
				}
			})
		}
	}
}

// Faults on the release calls of one sweep, each landing on a named call of
// its first pipeline: a reply lost after the call ran, a call lost on its
// way, and a call held by a stalled server and run after the next pass. The
// pipelines after one that went unanswered are not sent in that pass.
// Whatever the pass answered, every unit is given back once (I2, I6), every
// order ends cancelled by the sweeper, and every buyer's quota comes back.
func TestSweepReleaseFaults(t *testing.T) {
	const n = 80
	faults := []struct {
		name string
		arm  func(h *lostReply, match func([]any) bool)
	}{
		{"reply lost", func(h *lostReply, m func([]any) bool) { h.arm(3, m) }},
		{"call lost", func(h *lostReply, m func([]any) bool) { h.armDrop(3, m) }},
		{"call held", func(h *lostReply, m func([]any) bool) { h.armHold(3, m) }},
	}
	for _, b := range backends() {
		for _, fault := range faults {
			t.Run(b.name+"/"+fault.name, func(t *testing.T) {
				ctx := context.Background()
				rdb, lost := withLostReplies(t, b)
				f := expireOnOneShard(t, rdb, n)
				// Loaded: a pass that meets NOSCRIPT sends the calls again
				// only if no pipeline went unanswered.
				if err := rdb.ScriptLoad(ctx, scriptSource(t, "release")).Err(); err != nil {
					t.Fatal(err)
				}
				// The 2nd and 32nd calls: in the first pipeline, and its last
				// (stock.ReleaseBatch 32).
				seen := 0
				release := isScript(t, "release")
				fault.arm(lost, func(args []any) bool {
					if !release(args) {
						return false
					}
					seen++
					return seen == 2 || seen == stock.ReleaseBatch
				})
				st, err := f.e.Sweep(ctx)
				if lost.count() != 2 || err == nil {
					t.Fatalf("first pass: %+v %v with %d faults, want an error and 2", st, err, lost.count())
				}
				if want := stock.ReleaseBatch - 2; st.Released != want {
					t.Fatalf("first pass released %d, want the first pipeline's %d others (the later pipelines not sent)", st.Released, want)
				}
				f.sweepUntilQuiet()
				for _, cmd := range lost.sendHeld(ctx, rdb) {
					if v, err := cmd.Slice(); err != nil || len(v) == 0 || v[0] == int64(stock.Released) {
						t.Fatalf("a held release run late: %v %v, want it to give nothing back", v, err)
					}
				}
				f.sweepUntilQuiet()
				if c := f.assertConserved(); c.Available != n+10 || c.Reserved != 0 {
					t.Fatalf("after the faults: %+v, want every unit back once", c)
				}
				for i := range n {
					user := fmt.Sprintf("buyer-%d", i)
					if units := liveUnits(t, f, user); units != 0 {
						t.Fatalf("%s still holds %d units in the ledger", user, units)
					}
					if r := f.reserve(user, "again", 1); r.Outcome != engine.OutcomeReserved {
						t.Fatalf("%s after the sweep: %s, want its quota back", user, r.Outcome)
					}
				}
				var cancelled int
				err = f.l.Pool().QueryRow(ctx, `SELECT count(*) FROM flashsale_orders
					WHERE campaign_id = $1 AND status = $2`, f.cfg.CampaignID, ledger.StatusCancelledBySweeper).Scan(&cancelled)
				if err != nil || cancelled != n {
					t.Fatalf("%d orders cancelled by the sweeper (%v), want %d", cancelled, err, n)
				}
			})
		}
	}
}

// A sold reservation whose Redis step failed (the ledger says COMMITTED,
// Redis still holds it), failed again each time the checkout's process
// tried it, and fails again in the sweep does not keep the rest of its
// batch from being released: before, the pass stopped at it, and every
// expired reservation behind it waited, pass after pass.
func TestSweepReleasesPastAFailedSoldKey(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			rdb, lost := withLostReplies(t, b)
			const n = 10
			f := newFixture(t, rdb, withShards(1), withAllocation(n+10), withTTL(shortTTL, 100*time.Millisecond))
			ids := reserveMany(t, f, "buyer", n)
			lost.armDrop(1<<30, isScript(t, "commit"))
			_, _ = f.e.Checkout(ctx, "buyer-0", ids[0], "pay")
			if lost.count() != 1 || orderStatus(t, f, ids[0]) != ledger.StatusCommitted {
				t.Fatalf("checkout: %d Redis steps lost, order %s; want 1 and COMMITTED", lost.count(), orderStatus(t, f, ids[0]))
			}
			// Past its expiry and grace: the checkout's process no longer
			// tries the mark, and the sweep's fails too.
			time.Sleep(shortTTL + 300*time.Millisecond)
			st, err := f.e.Sweep(ctx)
			lost.arm(0, nil)
			if err == nil || st.Released != n-1 {
				t.Fatalf("sweep with the sold one failing: %+v %v; want an error and the %d others released", st, err, n-1)
			}
			f.sweepUntilQuiet()
			if c := f.assertConserved(); c.Sold != 1 || c.Reserved != 0 || c.Available != n+10-1 {
				t.Fatalf("after the sweeps: %+v", c)
			}
		})
	}
}

// A reply lost in a pipeline loses the replies behind it in that pipeline:
// those calls ran, and the sweeper does not know it. For reservations
// stolen from another shard, whether the tail lost is of releases or of
// the give-backs of their quota on the home shard, the buyers' quota is
// given back by the sweep's reaping of claims, once ClaimSlack has passed.
func TestSweepLostPipelineTailOfStolenReservations(t *testing.T) {
	for _, b := range backends() {
		for _, script := range []string{"release", "quota"} {
			t.Run(b.name+"/"+script, func(t *testing.T) { lostTailOfStolen(t, b, script) })
		}
	}
}

// stealFromShard0 sells out shard 1 of a 2-shard sale to buyers homed there
// (fillers of them), then has n more buyers homed there take a unit each
// from shard 0, and returns them.
func (f *fixture) stealFromShard0(n int) (fillers int, buyers []string) {
	f.t.Helper()
	fillers = f.sellOutShard(1)
	for i := 0; len(buyers) < n; i++ {
		if u := fmt.Sprintf("buyer-%d", i); stock.HomeShard(u, 2) == 1 {
			if r := f.reserve(u, "r", 1); r.Outcome != engine.OutcomeReserved || r.Reservation.Shard != 0 {
				f.t.Fatalf("%s: %+v, want a unit stolen from shard 0", u, r)
			}
			buyers = append(buyers, u)
		}
	}
	return fillers, buyers
}

func lostTailOfStolen(t *testing.T, b backend, script string) {
	ctx := context.Background()
	rdb, lost := withLostReplies(t, b)
	const n = 20
	f := newFixture(t, rdb, withShards(2), withAllocation(2*n), withSteal(1),
		withTTL(shortTTL, 100*time.Millisecond), withClaimSlack(100*time.Millisecond))
	fillers, buyers := f.stealFromShard0(n)
	time.Sleep(shortTTL + 300*time.Millisecond)
	first, err := f.e.Store().Expired(ctx, 0, time.Now().Add(time.Hour).UnixMilli(), 0, 1)
	if err != nil || len(first) != 1 {
		t.Fatalf("shard 0's first expired reservation: %v %v", first, err)
	}
	// EVALSHA sha numkeys keys... then the key: release.lua has 5 keys;
	// quota.lua has 2, then the operation and the user.
	is, keyAt, counted := isScript(t, script), 8, fillers
	if script == "quota" {
		keyAt, counted = 7, fillers+n
	}
	lost.armTail(1, func(args []any) bool { return is(args) && fmt.Sprint(args[keyAt]) == first[0].Key })
	st, err := f.e.Sweep(ctx)
	// A release's loss fails the pass. The quota script's may be a
	// give-back's, the home shard's, counted and left to its claim reaper, or
	// that reaper's own (it runs beside the release): a failed pass.
	told := err != nil
	if script == "quota" {
		told = err != nil || st.QuotaDeferred > 0
	}
	if lost.count() != 1 || !told || st.Released != counted {
		t.Fatalf("first pass: %+v %v, %d replies lost; want the loss told and %d released counted",
			st, err, lost.count(), counted)
	}
	f.sweepUntilQuiet()
	f.assertQuotaCovers()
	if c := f.assertConserved(); c.Available != 2*n || c.Reserved != 0 {
		t.Fatalf("after the sweeps: %+v, want every unit back once", c)
	}
	for _, u := range buyers {
		if r := f.reserve(u, "again", 1); r.Outcome != engine.OutcomeReserved {
			t.Fatalf("%s after the sweeps: %s, want its quota back", u, r.Outcome)
		}
	}
}

// The quota of released stolen reservations goes back on their home shard
// in pipelines too: in a sale that sold out, most reservations are stolen,
// and each give-back alone would cost the round trip the release saved.
func TestSweepGivesStolenQuotaBackTogether(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			rdb, _ := withLostReplies(t, b)
			trips := &scriptTrips{match: isScript(t, "quota")}
			stock.AddHook(rdb, trips)
			const n = 40
			f := newFixture(t, rdb, withShards(2), withAllocation(2*n), withSteal(1), withTTL(shortTTL, 100*time.Millisecond))
			fillers, buyers := f.stealFromShard0(n)
			time.Sleep(shortTTL + 300*time.Millisecond)
			if err := rdb.ScriptLoad(ctx, scriptSource(t, "quota")).Err(); err != nil {
				t.Fatal(err)
			}
			trips.mu.Lock()
			trips.alone, trips.pipelines, trips.piped = 0, 0, 0
			trips.mu.Unlock()
			st, err := f.e.Sweep(ctx)
			if err != nil || st.Released != fillers+n {
				t.Fatalf("sweep: %+v %v, want %d released", st, err, fillers+n)
			}
			alone, pipelines, piped := trips.counts()
			want := (n + stock.ReleaseBatch - 1) / stock.ReleaseBatch
			if alone != 0 || piped != n || pipelines != want {
				t.Fatalf("quota calls: %d alone, %d in %d pipelines; want 0 alone, %d in %d pipelines", alone, piped, pipelines, n, want)
			}
			f.assertQuotaCovers()
			for _, u := range buyers {
				if r := f.reserve(u, "again", 1); r.Outcome != engine.OutcomeReserved {
					t.Fatalf("%s after the sweep: %s, want its quota back", u, r.Outcome)
				}
			}
		})
	}
}
