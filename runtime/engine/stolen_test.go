package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Failure matrix: the API died while stealing. It had claimed the user's quota on
// the sold-out home shard and never confirmed the claim or gave it back. Until
// the claim is TTL + grace + ClaimSlack old the user stays at the limit (the
// same request is BUSY); then the sweeper gives the quota back, once. A claim
// whose reservation was already placed on another shard when the API died is
// given back once too: by the release of that expired reservation or by the
// reaper, whichever comes first, never both.
func TestAPIDiedWhileStealing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const slack = 300 * time.Millisecond
		f := newFixture(t, rdb, withAllocation(8), withShards(4), withTTL(shortTTL, 0), withClaimSlack(slack))
		ctx := context.Background()
		s := f.e.Store()
		// Two users homed on one shard, which fillers homed there empty.
		var users []string
		for i := 0; len(users) < 2; i++ {
			if u := fmt.Sprintf("buyer-%d", i); stock.HomeShard(u, 4) == 0 {
				users = append(users, u)
			}
		}
		fillers := f.sellOutShard(0)
		claim := func(user string) string {
			key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, "r")
			r, err := s.Reserve(ctx, stock.ReserveRequest{Shard: 0, Home: 0, Mode: stock.ModeClaim, User: user, Key: key,
				Quantity: 1, MaxPerUser: 1, TTL: shortTTL})
			if err != nil || r.Code != stock.Claimed {
				t.Fatalf("claim for %s: %+v %v", user, r, err)
			}
			return key
		}
		held := func(user string) string {
			v, err := rdb.HGet(ctx, s.Keys(0).Users(), user).Result()
			if errors.Is(err, redis.Nil) {
				return "0" // deleted at zero
			}
			if err != nil {
				t.Fatalf("quota of %s: %v", user, err)
			}
			return v
		}
		// ann: the API died right after claiming.
		claim(users[0])
		// bob: the API died after placing the reservation on shard 1, before confirming.
		bobKey := claim(users[1])
		if r, err := s.Reserve(ctx, stock.ReserveRequest{Shard: 1, Home: 0, Mode: stock.ModeSteal, User: users[1], Key: bobKey,
			Quantity: 1, MaxPerUser: 1, TTL: shortTTL}); err != nil || r.Code != stock.Reserved {
			t.Fatalf("steal for %s: %+v %v", users[1], r, err)
		}

		for _, u := range users {
			if r := f.reserve(u, "r", 1); r.Outcome != engine.OutcomeBusy {
				t.Fatalf("%s retrying the request: %s, want BUSY", u, r.Outcome)
			}
			if r := f.reserve(u, "another", 1); r.Outcome != engine.OutcomeLimit {
				t.Fatalf("%s with a new request: %s, want LIMIT_EXCEEDED", u, r.Outcome)
			}
		}
		if st, err := f.e.Sweep(ctx); err != nil || st.ReapedClaims != 0 || st.Released != 0 {
			t.Fatalf("sweep before the claims are stale: %+v %v", st, err)
		}

		time.Sleep(shortTTL + slack + 200*time.Millisecond)
		st := f.sweepUntilQuiet()
		if st.Abandoned != 1 || st.Released != fillers+1 {
			t.Fatalf("sweep %+v: want the %d fillers' reservations released, and bob's abandoned and released", st, fillers)
		}
		if st.ReapedClaims < 1 || st.ReapedClaims > 2 {
			t.Fatalf("reaped %d claims, want ann's (and bob's unless his release gave it back first)", st.ReapedClaims)
		}
		for _, u := range users {
			if h := held(u); h != "0" {
				t.Fatalf("%s holds %s units in Redis after the sweep, want 0", u, h)
			}
		}
		if n, err := rdb.ZCard(ctx, s.Keys(0).Claims()).Result(); err != nil || n != 0 {
			t.Fatalf("%d claims left in the index (%v)", n, err)
		}
		// Both may buy again, once each.
		for _, u := range users {
			if r := f.reserve(u, "after", 1); r.Outcome != engine.OutcomeReserved {
				t.Fatalf("%s after the sweep: %s", u, r.Outcome)
			}
			if r := f.reserve(u, "after-2", 1); r.Outcome != engine.OutcomeLimit {
				t.Fatalf("%s buying a second unit: %s, want LIMIT_EXCEEDED", u, r.Outcome)
			}
		}
		f.assertConserved()
	})
}

// Failure matrix: a stolen reservation was released on its shard, and giving
// its quota back on the user's home shard failed (a Redis error, or the
// process died between the two scripts). The release took it out of the
// expiry index, so the sweeper's reaper finds the quota through the claims
// index instead and gives it back once the ledger says the reservation ended;
// a stolen reservation that was sold keeps its quota. A rebuild in between
// puts the pointers of pending ones back into the claims index, scored by
// their expiry.
func TestStolenQuotaGiveBackRetried(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		t.Run("live", func(t *testing.T) { testStolenQuotaGiveBackRetried(t, rdb, false) })
		t.Run("rebuilt", func(t *testing.T) { testStolenQuotaGiveBackRetried(t, rdb, true) })
	})
}
func testStolenQuotaGiveBackRetried(t *testing.T, rdb redis.UniversalClient, rebuild bool) {
	const slack = 300 * time.Millisecond
	f := newFixture(t, rdb, withAllocation(8), withShards(4), withTTL(shortTTL, 0), withClaimSlack(slack))
	ctx := context.Background()
	f.sellOutShard(0)
	ann, cid := userHomedOn("ann", 0, 4), userHomedOn("cid", 0, 4)
	stolen := func(user string) engine.Reservation {
		r := f.reserve(user, "r", 1)
		if r.Outcome != engine.OutcomeReserved || r.Reservation.Shard == 0 {
			t.Fatalf("%s: %s on shard %d, want a reservation stolen from another shard", user, r.Outcome, r.Reservation.Shard)
		}
		return r.Reservation
	}
	annRes, cidRes := stolen(ann), stolen(cid)
	if _, err := f.e.Checkout(ctx, cid, cidRes.ID, "pay-cid"); err != nil {
		t.Fatal(err)
	}
	wait := slack + 100*time.Millisecond
	if rebuild {
		if _, err := f.e.Rebuild(ctx, openGate); err != nil {
			t.Fatal(err)
		}
		// Pending stolen reservations get their pointers back; a sold one
		// only its unit in its buyer's count, which nothing gives back.
		if n, err := rdb.ZCard(ctx, f.e.Store().Keys(0).Claims()).Result(); err != nil || n != 1 {
			t.Fatalf("claims index after the rebuild: %d entries (%v), want ann's", n, err)
		}
		wait += shortTTL // scored by expiry, not by claim time
	}

	// ann's reservation expires; the sweeper cancels it in the ledger and
	// releases the unit, then dies before giving the quota back.
	time.Sleep(shortTTL + 100*time.Millisecond)
	if st, err := f.l.CancelExpired(ctx, f.cfg.CampaignID, []string{annRes.ID}, 0); err != nil || st[annRes.ID] != ledger.StatusCancelledBySweeper {
		t.Fatalf("cancel: %v %v", st, err)
	}
	key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, ann, "r")
	if rr, err := f.e.Store().Release(ctx, annRes.Shard, key); err != nil || rr.Code != stock.Released {
		t.Fatalf("release: %+v %v", rr, err)
	}
	for _, u := range []string{ann, cid} {
		if r := f.reserve(u, "again", 1); r.Outcome != engine.OutcomeLimit {
			t.Fatalf("%s before the reaper: %s, want LIMIT_EXCEEDED", u, r.Outcome)
		}
	}

	time.Sleep(wait)
	if st := f.sweepUntilQuiet(); st.ReapedClaims != 1 {
		t.Fatalf("sweep %+v: want ann's quota given back, and only hers", st)
	}
	if r := f.reserve(ann, "after", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatalf("ann after the reaper: %s, want RESERVED", r.Outcome)
	}
	if r := f.reserve(cid, "after", 1); r.Outcome != engine.OutcomeLimit {
		t.Fatalf("cid, who bought a unit, after the reaper: %s, want LIMIT_EXCEEDED", r.Outcome)
	}
	if n, err := rdb.ZCard(ctx, f.e.Store().Keys(0).Claims()).Result(); err != nil || n != 0 {
		t.Fatalf("%d entries left in the claims index (%v)", n, err)
	}
	f.assertConserved()
}

// A stolen reservation whose ledger row was never written and whose unit went
// back, while giving its quota back failed: the field beside the pointer on the
// home shard names the buyer and quantity, so the reaper gives the quota back
// and the buyer can buy again. A pointer without it (an older version's) only
// leaves the claims index, instead of being asked about on every pass.
func TestStolenQuotaOfAnUnwrittenReservationGoesBack(t *testing.T) {
	const slack = 300 * time.Millisecond
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(8), withShards(4), withTTL(shortTTL, 0), withClaimSlack(slack))
	ctx := context.Background()
	f.sellOutShard(0)
	users := f.e.Store().Keys(0).Users()
	unwritten := func(user string) {
		r := f.reserve(user, "r", 1)
		if r.Outcome != engine.OutcomeReserved || r.Reservation.Shard == 0 {
			t.Fatalf("%s: %s on shard %d, want a stolen reservation", user, r.Outcome, r.Reservation.Shard)
		}
		// As if the row had never been written: the API gave the unit back,
		// and giving the quota back failed.
		if _, err := f.l.Pool().Exec(ctx, `DELETE FROM flashsale_orders WHERE reservation_id = $1`, r.Reservation.ID); err != nil {
			t.Fatal(err)
		}
		key := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, "r")
		if rr, err := f.e.Store().Release(ctx, r.Reservation.Shard, key); err != nil || rr.Code != stock.Released {
			t.Fatalf("release: %+v %v", rr, err)
		}
		want := stock.Pointer(r.Reservation.Shard, r.Reservation.ExpiresAt.UnixMilli())
		if got, err := rdb.HGet(ctx, users, stock.PointerFieldPrefix+key).Result(); err != nil || got != want {
			t.Fatalf("%s's pointer %q (%v), want %q", user, got, err, want)
		}
		if got, err := rdb.HGet(ctx, users, stock.BuyerField(key)).Result(); err != nil || got != stock.Buyer(1, user) {
			t.Fatalf("%s's pointer's buyer %q (%v), want %q", user, got, err, stock.Buyer(1, user))
		}
	}
	dan, eve := userHomedOn("dan", 0, 4), userHomedOn("eve", 0, 4)
	unwritten(dan)
	unwritten(eve)
	// As an older version confirmed it: the pointer alone.
	eveKey := stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, eve, "r")
	if err := rdb.HDel(ctx, users, stock.BuyerField(eveKey)).Err(); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{dan, eve} {
		if r := f.reserve(u, "again", 1); r.Outcome != engine.OutcomeLimit {
			t.Fatalf("%s before the reaper: %s, want LIMIT_EXCEEDED", u, r.Outcome)
		}
	}

	time.Sleep(shortTTL + slack + 200*time.Millisecond)
	if st := f.sweepUntilQuiet(); st.ReapedClaims != 1 {
		t.Fatalf("sweep %+v: want dan's quota given back, and only his", st)
	}
	if n, err := rdb.ZCard(ctx, f.e.Store().Keys(0).Claims()).Result(); err != nil || n != 0 {
		t.Fatalf("%d entries left in the claims index (%v)", n, err)
	}
	if r := f.reserve(dan, "after", 1); r.Outcome != engine.OutcomeReserved {
		t.Fatalf("dan after the reaper: %s, want RESERVED", r.Outcome)
	}
	if r := f.reserve(eve, "after", 1); r.Outcome != engine.OutcomeLimit {
		t.Fatalf("eve, whose pointer names no one, after the reaper: %s, want LIMIT_EXCEEDED", r.Outcome)
	}
	f.assertConserved()
}

// The quota script's claim bookkeeping, directly: a young claim is not reaped,
// a reaped claim cannot be confirmed or given back again, and a confirmed
// pointer is only reported by the reaper: forgetting it keeps the quota.
func TestClaimReapEdges(t *testing.T) {
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(4), withShards(2), withMaxPerUser(2))
	ctx := context.Background()
	s := f.e.Store()
	f.sellOutShard(0)
	user := ""
	for i := 0; user == ""; i++ {
		if u := fmt.Sprintf("u-%d", i); stock.HomeShard(u, 2) == 0 {
			user = u
		}
	}
	claim := func(req string, qty int) (key, stamp string) {
		key = stock.ReservationKey(f.cfg.IDSecret, f.cfg.CampaignID, user, req)
		r, err := s.Reserve(ctx, stock.ReserveRequest{Shard: 0, Home: 0, Mode: stock.ModeClaim, User: user, Key: key,
			Quantity: qty, MaxPerUser: 2, TTL: time.Minute})
		if err != nil || r.Code != stock.Claimed {
			t.Fatalf("claim: %+v %v", r, err)
		}
		return key, r.Status
	}
	held := func() string {
		v, err := rdb.HGet(ctx, s.Keys(0).Users(), user).Result()
		if errors.Is(err, redis.Nil) {
			return "0" // deleted at zero
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	now, err := s.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}

	a, aStamp := claim("a", 2)
	if ok, on, err := s.ReapClaim(ctx, 0, a, now.Add(-time.Minute)); err != nil || ok || on != -1 {
		t.Fatalf("young claim reaped: %v %d %v", ok, on, err)
	}
	later := now.Add(time.Minute)
	if keys, err := s.StaleClaims(ctx, 0, later, 0, 10); err != nil || len(keys) != 1 || keys[0] != a {
		t.Fatalf("stale claims %v %v", keys, err)
	}
	if ok, _, err := s.ReapClaim(ctx, 0, a, later); err != nil || !ok || held() != "0" {
		t.Fatalf("reap: %v %v, held %s", ok, err, held())
	}
	if ok, err := s.ConfirmClaim(ctx, 0, a, aStamp, 1, 1); err != nil || ok {
		t.Fatalf("confirm after reap changed something: %v %v", ok, err)
	}
	if ok, err := s.Unclaim(ctx, 0, a, aStamp); err != nil || ok {
		t.Fatalf("unclaim after reap changed something: %v %v", ok, err)
	}
	if ok, err := s.Quota(ctx, 0, stock.QuotaRelease, user, a, 2, 1, 1); err != nil || ok {
		t.Fatalf("release after reap changed something: %v %v", ok, err)
	}
	if n, err := rdb.HExists(ctx, s.Keys(0).Users(), user).Result(); err != nil || n {
		t.Fatalf("the user's field is left at zero after the reap (%v)", err)
	}
	if ok, _, err := s.ReapClaim(ctx, 0, a, later); err != nil || ok || held() != "0" {
		t.Fatalf("second reap: %v %v, held %s", ok, err, held())
	}

	b, bStamp := claim("b", 1)
	if ok, err := s.ConfirmClaim(ctx, 0, b, bStamp+"1", 1, later.UnixMilli()); err != nil || ok {
		t.Fatalf("confirm naming another claim: %v %v", ok, err)
	}
	if ok, err := s.ConfirmClaim(ctx, 0, b, bStamp, 1, later.UnixMilli()); err != nil || !ok {
		t.Fatalf("confirm: %v %v", ok, err)
	}
	for range 2 {
		ok, p, err := s.ReapClaimAt(ctx, 0, b, later)
		want := stock.Placement{Shard: 1, ExpiryMs: later.UnixMilli(), Quantity: 1, User: user}
		if err != nil || ok || p != want || held() != "1" {
			t.Fatalf("reap of a confirmed pointer: %v %+v %v, held %s; want %+v", ok, p, err, held(), want)
		}
	}
	if ok, err := s.Quota(ctx, 0, stock.QuotaForget, user, b, 1, 1, later.UnixMilli()+1); err != nil || ok {
		t.Fatalf("forget naming another placement: %v %v", ok, err)
	}
	if ok, err := s.Quota(ctx, 0, stock.QuotaForget, user, b, 1, 1, later.UnixMilli()); err != nil || !ok || held() != "1" {
		t.Fatalf("forget: %v %v, held %s", ok, err, held())
	}
	if n, err := rdb.HExists(ctx, s.Keys(0).Users(), "p:"+b).Result(); err != nil || n {
		t.Fatalf("the pointer of a sold reservation is left after forget (%v)", err)
	}
	if n, err := rdb.ZCard(ctx, s.Keys(0).Claims()).Result(); err != nil || n != 0 {
		t.Fatalf("%d entries left in the claims index (%v)", n, err)
	}
	// Forgetting a claim still being placed changes nothing.
	c, _ := claim("c", 1)
	if ok, err := s.Quota(ctx, 0, stock.QuotaForget, user, c, 1, 0, 0); err != nil || ok || held() != "2" {
		t.Fatalf("forget of a claim: %v %v, held %s", ok, err, held())
	}
}
