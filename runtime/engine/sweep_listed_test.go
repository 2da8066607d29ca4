package engine_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A sweep gives back the placement it listed, and only that one. Here the
// request that made it, its ledger row never written, gave it back itself
// after the sweep found no row for it, and the buyer's retry of the same
// request placed another, was told it is reserved, and pays for it. The
// sweep must leave that one: released by its key, its unit would be sold and
// back in stock at once (I1).
func TestASweepLeavesARetrysPlacementOfAKeyItListed(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withShards(1), withAllocation(5), withTTL(shortTTL, 0))
	ctx := context.Background()
	const user = "rhea"
	key, p1 := f.placeUnrecorded(user, f.cfg.TTL)
	time.Sleep(shortTTL + 200*time.Millisecond)

	// The sweeper's client plays the request and its retry at the named steps.
	var retried engine.ReserveResult
	steps := &beforeCommands{at: map[string]func(){
		// The sweep reads the reservation (no ledger row): the request gives
		// it back first.
		"hgetall": func() {
			if rr, err := f.e.Store().ReleasePlaced(ctx, 0, key, p1.ExpiryMs, p1.Epoch); err != nil || rr.Code != stock.Released {
				t.Errorf("the request's give-back: %+v %v", rr, err)
			}
		},
		// The sweep's release is about to go: the retry places another.
		"evalsha": func() { retried = f.reserve(user, "r", 1) },
	}}
	swept := standaloneClient(t, sharedRedis.Addr())
	stock.AddHook(swept, steps)
	if _, err := openEngine(t, f.cfg, swept, f.l).Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if steps.left() != 0 || retried.Outcome != engine.OutcomeReserved {
		t.Fatalf("steps not taken: %d, the retry %s", steps.left(), retried.Outcome)
	}
	if out, err := f.e.Checkout(ctx, user, retried.Reservation.ID, "pay-1"); err != nil || out.Outcome != ledger.CheckoutCommitted {
		t.Fatalf("checkout of the retry's reservation: %+v %v", out.Outcome, err)
	}
	if c := f.assertConserved(); c.Sold != 1 || c.Available != 4 {
		t.Fatalf("counts %+v, want 1 sold and 4 available", c)
	}
}

// beforeCommands runs at[name] once, before the first command (or
// pipeline) of that name on the reservation's hash or through the scripts.
type beforeCommands struct {
	mu sync.Mutex
	at map[string]func()
}

func (b *beforeCommands) run(cmd redis.Cmder) {
	name := strings.ToLower(cmd.Name())
	if name == "hgetall" && !strings.Contains(cmd.String(), ":res:") {
		return
	}
	b.mu.Lock()
	f, ok := b.at[name]
	delete(b.at, name)
	b.mu.Unlock()
	if ok {
		f()
	}
}

func (b *beforeCommands) left() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.at) }

func (b *beforeCommands) DialHook(next redis.DialHook) redis.DialHook { return next }
func (b *beforeCommands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { b.run(cmd); return next(ctx, cmd) }
}
func (b *beforeCommands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 {
			b.run(cmds[0])
		}
		return next(ctx, cmds)
	}
}

// A sweep that finds no row for a placement it listed records it abandoned
// only if the key still holds that placement: here the request gave it back
// and its retry placed another, whose row is not written yet, before the
// sweep read the key. Recorded abandoned, the retry's row would meet that
// record and the buyer be told EXPIRED for a reservation just made.
func TestASweepDoesNotAbandonARetrysPlacement(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withShards(1), withAllocation(5), withTTL(shortTTL, 0))
	ctx := context.Background()
	const user = "remy"
	key, p1 := f.placeUnrecorded(user, f.cfg.TTL)
	time.Sleep(shortTTL + 200*time.Millisecond)
	steps := &beforeCommands{at: map[string]func(){
		"hgetall": func() {
			if rr, err := f.e.Store().ReleasePlaced(ctx, 0, key, p1.ExpiryMs, p1.Epoch); err != nil || rr.Code != stock.Released {
				t.Errorf("the request's give-back: %+v %v", rr, err)
			}
			f.placeUnrecorded(user, time.Hour) // the retry's, its row on its way
		},
	}}
	swept := standaloneClient(t, sharedRedis.Addr())
	stock.AddHook(swept, steps)
	st, err := openEngine(t, f.cfg, swept, f.l).Sweep(ctx)
	if err != nil || steps.left() != 0 {
		t.Fatalf("sweep: %+v %v, %d steps not taken", st, err, steps.left())
	}
	if o, err := f.l.GetRequestOrder(ctx, f.cfg.CampaignID, key); err == nil {
		t.Fatalf("the sweep recorded the retry's placement: %s row", o.Status)
	}
	if states, err := f.e.Store().State(ctx); err != nil || states[0].Reserved != 1 {
		t.Fatalf("after the sweep: %+v %v, want the retry's unit held", states, err)
	}
}

// Two sweepers' passes can overlap (a pass runs up to 25 s, a replica's
// lease moves after 15 s without renewal). Both find an expired reservation
// without a ledger row; one records it abandoned and releases it first. The
// other's pass meets that row: it must not count the reservation abandoned
// again (flashsale_sweeper_reservations_total{outcome="abandoned"} is
// summed over the replicas), nor release it twice. Two reservations: the
// first sweeper has read one's hash when the other's pass runs.
func TestOverlappingSweepsCountAnAbandonedReservationOnce(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withShards(1), withAllocation(5), withTTL(shortTTL, 0))
	ctx := context.Background()
	for _, user := range []string{"castor", "pollux"} {
		f.placeUnrecorded(user, f.cfg.TTL)
	}
	time.Sleep(shortTTL + 200*time.Millisecond)

	// The second sweeper's whole pass runs as the first is about to read
	// the second reservation's hash, having read the first's.
	var other engine.SweepStats
	steps := &beforeCommands{}
	steps.at = map[string]func(){
		"hgetall": func() {
			steps.mu.Lock()
			defer steps.mu.Unlock()
			steps.at["hgetall"] = func() {
				var err error
				if other, err = f.e.Sweep(ctx); err != nil {
					t.Errorf("the other sweeper's pass: %v", err)
				}
			}
		},
	}
	first := standaloneClient(t, sharedRedis.Addr())
	stock.AddHook(first, steps)
	st, err := openEngine(t, f.cfg, first, f.l).Sweep(ctx)
	if err != nil || steps.left() != 0 {
		t.Fatalf("the first sweeper's pass: %v, steps left %d", err, steps.left())
	}
	if st.Abandoned+other.Abandoned != 2 || st.Released+other.Released != 2 {
		t.Fatalf("abandoned %d + %d, released %d + %d: want each reservation counted once", st.Abandoned, other.Abandoned, st.Released, other.Released)
	}
	if c := f.assertConserved(); c.Available != 5 {
		t.Fatalf("counts %+v, want every unit back", c)
	}
}
