package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Break: a sweeper down for longer than the reservation hash's backstop TTL
// found no hash to release, and the units never came back. Held hashes have
// no TTL now, but those an earlier version wrote had one, and a Redis that
// evicts keys drops them too. The ledger row has what the release needs:
// reserved units (on the buyer's home shard, and stolen from another) come
// back, and a sold one whose Redis mark was missed leaves the reserved
// count, once.
func TestSweeperOutageLongerThanTheBackstop(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const ttl = 300 * time.Millisecond
		f := newFixture(t, rdb, withAllocation(6), withShards(3), withMaxPerUser(1), withTTL(ttl, 0))
		ctx := context.Background()
		s := f.e.Store()
		homed := userHomedOn("homed", 0, 3)
		home := f.reserve(homed, "r", 1)
		paid := f.reserve(userHomedOn("paid", 1, 3), "r", 1)
		// The buyer's checkout commits in the ledger; its Redis mark is lost.
		if out, _, err := f.l.Checkout(ctx, f.cfg.CampaignID, paid.Reservation.ID, userHomedOn("paid", 1, 3), "pay"); err != nil || out != ledger.CheckoutCommitted {
			t.Fatalf("checkout: %v %v", out, err)
		}
		f.sellOutShard(2)
		thief := userHomedOn("thief", 2, 3)
		stolen := f.reserve(thief, "r", 1)
		if stolen.Outcome != engine.OutcomeReserved || stolen.Reservation.Shard == 2 {
			t.Fatalf("thief: %+v, want a stolen reservation", stolen)
		}
		for _, r := range []engine.ReserveResult{home, paid, stolen} {
			if r.Outcome != engine.OutcomeReserved {
				t.Fatalf("reserve: %+v", r)
			}
		}

		// The sweeper is down until every hash is gone.
		time.Sleep(ttl)
		for _, r := range []engine.Reservation{home.Reservation, paid.Reservation, stolen.Reservation} {
			_, key, err := stock.ParseID(r.ID, 3)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := rdb.Del(ctx, s.Keys(r.Shard).Res(key)).Result(); err != nil || n != 1 {
				t.Fatalf("the hash of %s: %d deleted (%v)", r.ID, n, err)
			}
		}
		st := f.sweepUntilQuiet()
		if st.Released < 2 || st.Committed != 1 {
			t.Fatalf("sweep after the outage: %+v, want the two reserved units released and the sold one counted", st)
		}
		c := f.assertConserved()
		if c.Sold != 1 || c.Reserved != 0 || c.Available != 5 {
			t.Fatalf("counts after the outage: %+v, want 1 sold, 5 available", c)
		}
		f.assertQuotaCovers()
		// Sweeping again changes nothing: each unit came back once.
		if st := f.sweepUntilQuiet(); st.Released != 0 || st.Committed != 0 {
			t.Fatalf("second sweep: %+v", st)
		}
		for _, u := range []string{homed, thief} {
			if n, err := rdb.HExists(ctx, s.Keys(stock.HomeShard(u, 3)).Users(), u).Result(); err != nil || n {
				t.Fatalf("%s still counted on its home shard after its release (%v)", u, err)
			}
			if r := f.reserve(u, "again", 1); r.Outcome != engine.OutcomeReserved {
				t.Fatalf("%s after the release: %s, want RESERVED", u, r.Outcome)
			}
		}
	})
}

// Break: a reservation whose ledger row was never written (its reserve pod
// died right after the Redis step) outlived its hash's backstop TTL during a
// sweeper outage. With neither the hash nor a row to say what it held, the
// sweep dropped its index entry and its unit never came back: the sale never
// completed, and its buyer stayed at the limit. A held hash has no TTL now,
// whatever the backstop; the sweep records it abandoned and gives it back.
func TestAnUnrecordedReservationOutlivesTheBackstop(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withShards(1), withAllocation(3), withMaxPerUser(1),
		withTTL(shortTTL, 0), withBackstop(time.Second))
	const user = "orpheus"
	f.placeUnrecorded(user, f.cfg.TTL)
	// The sweeper is down past the backstop.
	time.Sleep(time.Second + 500*time.Millisecond)
	if st := f.sweepUntilQuiet(); st.Abandoned != 1 || st.Released != 1 {
		t.Fatalf("sweep: %+v, want the reservation recorded abandoned and released", st)
	}
	if c := f.assertConserved(); c.Reserved != 0 || c.Available != 3 {
		t.Fatalf("counts %+v, want every unit available", c)
	}
	if r := f.reserve(user, "again", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatalf("the buyer after the sweep: %s, want RESERVED", r.Outcome)
	}
}
