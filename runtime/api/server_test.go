package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

func TestReserveCheckoutCancel(t *testing.T) {
	f := newFixture(t, withAllocation(10), withShards(3))
	ctx := context.Background()

	// A new reservation: 201, durable in the ledger before the answer.
	r := f.call(http.MethodPost, reservePath, f.token("alice"), reserveBody("alice", "req-1", 1))
	if r.status != http.StatusCreated {
		t.Fatalf("reserve: %d %s", r.status, r.body)
	}
	var res ReservationBody
	r.decode(t, &res)
	if res.Status != "reserved" || res.ReservationID == "" {
		t.Fatalf("body %s", r.body)
	}
	exp, err := time.Parse(time.RFC3339, res.ExpiresAt)
	if err != nil || time.Until(exp) < 50*time.Second || time.Until(exp) > 61*time.Second {
		t.Fatalf("expires_at %q is not about a TTL away (%v)", res.ExpiresAt, err)
	}
	if o, err := f.l.GetOrder(ctx, f.e.Config().CampaignID, res.ReservationID); err != nil || o.Status != ledger.StatusPending || o.UserID != "alice" {
		t.Fatalf("ledger row %+v, %v", o, err)
	}

	// The same request again: 200 and the very same body.
	again := f.call(http.MethodPost, reservePath, f.token("alice"), reserveBody("alice", "req-1", 1))
	if again.status != http.StatusOK || string(again.body) != string(r.body) {
		t.Fatalf("replay: %d %s, want 200 %s", again.status, again.body, r.body)
	}
	if c := f.assertConserved(); c.Reserved != 1 {
		t.Fatalf("replay took another unit: %+v", c)
	}

	// Checkout: 200, and the same payment token again is the same answer.
	for range 2 {
		co := f.checkout("alice", res.ReservationID, "pay-1")
		var ob OrderBody
		if co.status != http.StatusOK {
			t.Fatalf("checkout: %d %s", co.status, co.body)
		}
		co.decode(t, &ob)
		if ob.OrderID != res.ReservationID || ob.Status != "confirmed" {
			t.Fatalf("checkout body %s", co.body)
		}
	}

	// Cancel another reservation: 200, the unit is back; a retried cancel is 200 too.
	bob := f.reserve("bob", "req-1", 2)
	for range 2 {
		c := f.call(http.MethodDelete, cancelPath(bob.ReservationID), f.token("bob"), nil)
		if c.status != http.StatusOK || strings.TrimSpace(string(c.body)) != `{"status":"cancelled"}` {
			t.Fatalf("cancel: %d %s", c.status, c.body)
		}
	}
	if o, _ := f.l.GetOrder(ctx, f.e.Config().CampaignID, bob.ReservationID); o.Status != ledger.StatusCancelledByUser {
		t.Fatalf("cancelled row says %s", o.Status)
	}
	c := f.assertConserved()
	if c.Sold != 1 || c.Reserved != 0 || c.Available != 9 {
		t.Fatalf("counts %+v", c)
	}

	// Availability: no token, the Redis figure.
	av := f.call(http.MethodGet, availabilityPath(testSKU), "", nil)
	var ab AvailabilityBody
	av.decode(t, &ab)
	if av.status != http.StatusOK || ab.ItemID != testSKU || ab.Available != 9 || ab.Status != StatusOpen {
		t.Fatalf("availability: %d %s", av.status, av.body)
	}
}

func TestReserveOutcomes(t *testing.T) {
	f := newFixture(t, withAllocation(2), withShards(1), withMaxPerUser(1))

	f.reserve("u1", "k", 1)
	// Limit: u1 already holds its one unit.
	r := f.call(http.MethodPost, reservePath, f.token("u1"), reserveBody("u1", "k2", 1))
	if e := r.errorBody(t); r.status != http.StatusConflict || e.Code != CodeLimitExceeded {
		t.Fatalf("limit: %d %s", r.status, r.body)
	}
	f.reserve("u2", "k", 1)
	// Sold out.
	r = f.call(http.MethodPost, reservePath, f.token("u3"), reserveBody("u3", "k", 1))
	if e := r.errorBody(t); r.status != http.StatusGone || e.Code != CodeSoldOut {
		t.Fatalf("sold out: %d %s", r.status, r.body)
	}
	av := f.call(http.MethodGet, availabilityPath(testSKU), "", nil)
	if !strings.Contains(string(av.body), `"available":0,"status":"SOLD_OUT"`) {
		t.Fatalf("availability when sold out: %s", av.body)
	}

	// Expired: the request's reservation was cancelled; its key cannot be reused.
	u2 := f.call(http.MethodPost, reservePath, f.token("u2"), reserveBody("u2", "k", 1))
	var b ReservationBody
	u2.decode(t, &b)
	if c := f.call(http.MethodDelete, cancelPath(b.ReservationID), f.token("u2"), nil); c.status != http.StatusOK {
		t.Fatalf("cancel: %d %s", c.status, c.body)
	}
	r = f.call(http.MethodPost, reservePath, f.token("u2"), reserveBody("u2", "k", 1))
	if e := r.errorBody(t); r.status != http.StatusGone || e.Code != CodeExpired {
		t.Fatalf("reuse of a cancelled request: %d %s", r.status, r.body)
	}
	f.assertConserved()
}

// The same idempotency_key with another quantity is another request: it is
// refused and takes nothing, instead of being answered with the original
// reservation as if it held what was asked.
func TestIdempotencyKeyReusedWithAnotherQuantity(t *testing.T) {
	f := newFixture(t, withAllocation(10), withShards(2), withMaxPerUser(2))
	first := f.reserve("ann", "k", 1)
	before := f.counts()
	r := f.call(http.MethodPost, reservePath, f.token("ann"), reserveBody("ann", "k", 2))
	if e := r.errorBody(t); r.status != http.StatusConflict || e.Code != CodeConflict || !strings.Contains(e.Message, "1 unit") {
		t.Fatalf("same key, quantity 2: %d %s", r.status, r.body)
	}
	if after := f.counts(); !sameCounts(before, after) {
		t.Fatalf("the refused request changed the counts: %+v -> %+v", before, after)
	}
	// The original request still replays.
	r = f.call(http.MethodPost, reservePath, f.token("ann"), reserveBody("ann", "k", 1))
	var b ReservationBody
	r.decode(t, &b)
	if r.status != http.StatusOK || b.ReservationID != first.ReservationID {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	f.assertConserved()
}

func TestCheckoutAfterExpiry(t *testing.T) {
	f := newFixture(t, withAllocation(5), withTTL(time.Second))
	res := f.reserve("late", "k", 1)
	time.Sleep(1500 * time.Millisecond)
	r := f.checkout("late", res.ReservationID, "pay-late")
	e := r.errorBody(t)
	if r.status != http.StatusGone || e.Code != CodeExpired || !strings.Contains(e.Message, "voided") {
		t.Fatalf("late checkout: %d %s", r.status, r.body)
	}
	if o, _ := f.l.GetOrder(context.Background(), f.e.Config().CampaignID, res.ReservationID); o.Status == ledger.StatusCommitted {
		t.Fatal("a late payment committed (I7)")
	}
}

// The gates the controller sets answer with their own codes, and the 503s say
// when to come back.
func TestClosedGates(t *testing.T) {
	f := newFixture(t, withAllocation(10), withShards(2))
	for _, tc := range []struct {
		gate       string
		status     int
		code       Code
		retryAfter bool
		avail      string
	}{
		{stock.StateNotStarted, http.StatusTooEarly, CodeNotStarted, true, StatusNotStarted},
		{stock.StatePaused, http.StatusServiceUnavailable, CodePaused, true, StatusPaused},
		{stock.StateEnded, http.StatusGone, CodeEnded, false, StatusEnded},
	} {
		t.Run(tc.gate, func(t *testing.T) {
			f.setGate(tc.gate)
			before := f.counts()
			r := f.call(http.MethodPost, reservePath, f.token("u"), reserveBody("u", "k-"+tc.gate, 1))
			if e := r.errorBody(t); r.status != tc.status || e.Code != tc.code {
				t.Fatalf("%d %s, want %d %s", r.status, r.body, tc.status, tc.code)
			}
			if got := r.header.Get("Retry-After"); (got != "") != tc.retryAfter {
				t.Fatalf("Retry-After %q, want one: %v", got, tc.retryAfter)
			}
			if !sameCounts(before, f.counts()) {
				t.Fatal("a closed gate changed the stock")
			}
			time.Sleep(DefaultAvailabilityCache)
			av := f.call(http.MethodGet, availabilityPath(testSKU), "", nil)
			if !strings.Contains(string(av.body), `"status":"`+tc.avail+`"`) {
				t.Fatalf("availability: %s", av.body)
			}
		})
	}

	// The shards' schedule (the operator's SetWindow) closes an open gate by
	// the Redis clock: past the end as ENDED, before the start as NOT_STARTED,
	// and availability says what reserve answers.
	for _, tc := range []struct {
		name       string
		start, end time.Duration // from now; 0: none
		status     int
		code       Code
		avail      string
	}{
		{"past the window's end", -time.Hour, -time.Second, http.StatusGone, CodeEnded, StatusEnded},
		{"before the window's start", time.Hour, 0, http.StatusTooEarly, CodeNotStarted, StatusNotStarted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.setGate(stock.StateOpen)
			at := func(d time.Duration) time.Time {
				if d == 0 {
					return time.Time{}
				}
				return time.Now().Add(d)
			}
			if _, err := f.e.Gates().SetWindow(context.Background(), at(tc.start), at(tc.end)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = f.e.Gates().SetWindow(context.Background(), time.Time{}, time.Time{}) })
			before := f.counts()
			r := f.call(http.MethodPost, reservePath, f.token("u"), reserveBody("u", "k-"+tc.name, 1))
			if e := r.errorBody(t); r.status != tc.status || e.Code != tc.code {
				t.Fatalf("%d %s, want %d %s", r.status, r.body, tc.status, tc.code)
			}
			if !sameCounts(before, f.counts()) {
				t.Fatal("a reserve outside the window changed the stock")
			}
			time.Sleep(DefaultAvailabilityCache)
			av := f.call(http.MethodGet, availabilityPath(testSKU), "", nil)
			if !strings.Contains(string(av.body), `"status":"`+tc.avail+`"`) {
				t.Fatalf("availability: %s", av.body)
			}
		})
	}

	t.Run("shard data from another server process", func(t *testing.T) {
		f.setGate(stock.StateOpen)
		// What a restart from a snapshot or a promoted replica looks like: the
		// meta names another server. Refused like any closed shard, nothing taken.
		before := f.counts()
		for i := range 2 {
			if err := f.rdb.HSet(context.Background(), stock.ShardKeys(f.e.Config().CampaignID, i).Meta(), "srv", "0123456789abcdef0123456789abcdef01234567").Err(); err != nil {
				t.Fatal(err)
			}
		}
		r := f.call(http.MethodPost, reservePath, f.token("u"), reserveBody("u", "k-foreign", 1))
		if e := r.errorBody(t); r.status != http.StatusServiceUnavailable || e.Code != CodeClosed || r.header.Get("Retry-After") == "" {
			t.Fatalf("%d %s %v", r.status, r.body, r.header)
		}
		if !sameCounts(before, f.counts()) {
			t.Fatal("a refused reserve changed the stock")
		}
		// Availability does not advertise what reserve refuses.
		time.Sleep(DefaultAvailabilityCache)
		av := f.call(http.MethodGet, availabilityPath(testSKU), "", nil)
		if !strings.Contains(string(av.body), `"status":"CLOSED"`) {
			t.Fatalf("availability: %s", av.body)
		}
	})

	t.Run("shard lost its meta", func(t *testing.T) {
		f.setGate(stock.StateOpen)
		// Fail closed: a shard without meta (Redis lost data) refuses everything.
		for i := range 2 {
			if err := f.rdb.Del(context.Background(), stock.ShardKeys(f.e.Config().CampaignID, i).Meta()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		r := f.call(http.MethodPost, reservePath, f.token("u"), reserveBody("u", "k-lost", 1))
		if e := r.errorBody(t); r.status != http.StatusServiceUnavailable || e.Code != CodeClosed || r.header.Get("Retry-After") == "" {
			t.Fatalf("%d %s %v", r.status, r.body, r.header)
		}
		time.Sleep(DefaultAvailabilityCache)
		av := f.call(http.MethodGet, availabilityPath(testSKU), "", nil)
		if !strings.Contains(string(av.body), `"status":"CLOSED"`) {
			t.Fatalf("availability: %s", av.body)
		}
	})
}

// A process that has not made a reserve call since Redis restarted (from a
// snapshot, or a promoted replica) still reports the shards it would refuse:
// availability and the shard gauge read the servers' run ids themselves.
func TestForeignShardsClosedBeforeAnyReserve(t *testing.T) {
	f := newFixture(t, withAllocation(10), withShards(2))
	if err := f.rdb.HSet(context.Background(), stock.ShardKeys(f.e.Config().CampaignID, 1).Meta(), "srv", "0123456789abcdef0123456789abcdef01234567").Err(); err != nil {
		t.Fatal(err)
	}
	av := f.call(http.MethodGet, availabilityPath(testSKU), "", nil)
	if av.status != http.StatusOK || !strings.Contains(string(av.body), `"status":"CLOSED"`) {
		t.Fatalf("availability: %d %s", av.status, av.body)
	}
	m := f.call(http.MethodGet, "/metrics", "", nil)
	for _, want := range []string{`flashsale_shard_open{shard="0"} 1`, `flashsale_shard_open{shard="1"} 0`} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// The same journey on a Redis Cluster: every script touches one slot, the shard
// read for availability spans them all.
func TestReserveOnRedisCluster(t *testing.T) {
	cluster := testharness.RedisClusterT(t)
	f := newFixture(t, withCluster(cluster.Addrs()), withAllocation(12), withShards(6))
	r := f.reserve("carol", "k", 2)
	if again := f.call(http.MethodPost, reservePath, f.token("carol"), reserveBody("carol", "k", 2)); again.status != http.StatusOK {
		t.Fatalf("replay: %d %s", again.status, again.body)
	}
	if co := f.checkout("carol", r.ReservationID, "pay"); co.status != http.StatusOK {
		t.Fatalf("checkout: %d %s", co.status, co.body)
	}
	d := f.reserve("dave", "k", 1)
	if c := f.call(http.MethodDelete, cancelPath(d.ReservationID), f.token("dave"), nil); c.status != http.StatusOK {
		t.Fatalf("cancel: %d %s", c.status, c.body)
	}
	av := f.call(http.MethodGet, availabilityPath(testSKU), "", nil)
	if !strings.Contains(string(av.body), `"available":10,"status":"OPEN"`) {
		t.Fatalf("availability: %s", av.body)
	}
	if r := f.call(http.MethodGet, "/readyz", "", nil); r.status != http.StatusOK {
		t.Fatalf("readyz: %d %s", r.status, r.body)
	}
	c := f.assertConserved()
	if c.Sold != 2 || c.Reserved != 0 {
		t.Fatalf("counts %+v", c)
	}
}

// Many buyers at once, each retrying its request: one unit per acknowledged
// reservation, replays name the same reservation, and the audit balances (I1, I2,
// I3, I4, I5 through HTTP).
func TestConcurrentBuyers(t *testing.T) {
	const (
		buyers     = 150
		allocation = 60
	)
	f := newFixture(t, withAllocation(allocation), withShards(4), withMaxPerUser(1))
	var (
		mu      sync.Mutex
		ids     = map[string]string{} // user -> reservation id
		created int
		wg      sync.WaitGroup
	)
	for i := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := fmt.Sprintf("buyer-%d", i)
			tok := f.token(u)
			for attempt := range 3 {
				// Two tries of one request, then a second request the limit refuses.
				key := "first"
				if attempt == 2 {
					key = "second"
				}
				r := f.call(http.MethodPost, reservePath, tok, reserveBody(u, key, 1))
				mu.Lock()
				switch r.status {
				case http.StatusCreated, http.StatusOK:
					var b ReservationBody
					r.decode(t, &b)
					if key == "second" {
						t.Errorf("%s got a second reservation", u)
					} else if prev, ok := ids[u]; ok && prev != b.ReservationID {
						t.Errorf("%s: two ids for one request: %s, %s", u, prev, b.ReservationID)
					}
					ids[u] = b.ReservationID
					if r.status == http.StatusCreated {
						created++
					}
				case http.StatusGone, http.StatusConflict:
				default:
					t.Errorf("%s: %d %s", u, r.status, r.body)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	c := f.assertConserved()
	if int64(created) != c.Reserved || created != len(ids) || created > allocation {
		t.Fatalf("%d created, %d buyers hold one, Redis holds %d units of %d", created, len(ids), c.Reserved, allocation)
	}
	// Stealing keeps the undersell small: at most a shard's worth stays unsold.
	if created < allocation-allocation/4 {
		t.Fatalf("only %d of %d units reserved by %d buyers", created, allocation, buyers)
	}
	for u, id := range ids {
		if o, err := f.l.GetOrder(context.Background(), f.e.Config().CampaignID, id); err != nil || o.UserID != u {
			t.Fatalf("%s: row %+v %v", id, o, err)
		}
	}
}

// A reservation made durable after the server's write timeout has run out (a
// slow ledger) still gets its 201: the answer has its own time to be written.
func TestSlowLedgerAnswerNotCutOff(t *testing.T) {
	f := newFixture(t, withWriteTimeout(300*time.Millisecond))
	ctx := context.Background()
	// The group-commit statement share-locks the campaign row: hold it longer
	// than the write timeout.
	tx, err := f.l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE`, f.e.Config().CampaignID); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		released <- tx.Commit(ctx)
	}()
	r, err := f.tryCall(http.MethodPost, reservePath, f.token("ann"), reserveBody("ann", "k-1", 1))
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("the answer was cut off: %v", err)
	}
	if r.status != http.StatusCreated {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var res ReservationBody
	r.decode(t, &res)
	if o, err := f.l.GetOrder(ctx, f.e.Config().CampaignID, res.ReservationID); err != nil || o.Status != ledger.StatusPending {
		t.Fatalf("ledger row %+v %v", o, err)
	}
}

// An admission key that ends in a newline (a Secret made from a file) is taken
// both ways: tokens signed with the key as stored and with the key stripped, as
// tools that read it from a file sign them; the previous key of a rotation
// likewise. Other keys are still refused.
func TestAdmissionKeyWithAndWithoutItsNewline(t *testing.T) {
	stored := append(append([]byte{}, testKey...), '\n')
	previous := []byte("the-old-key-0123456789")
	previousStored := append(append([]byte{}, previous...), '\n')
	f := newFixture(t, func(c *fixtureConfig) {
		c.api.AdmissionKeyAlt = stored
		c.api.AdmissionKeyPrevious, c.api.AdmissionKeyPreviousAlt = previous, previousStored
	})
	for name, key := range map[string][]byte{"stripped": testKey, "as stored": stored,
		"previous stripped": previous, "previous as stored": previousStored} {
		tok, err := admission.Mint(key, testSKU, "nadia-"+name, time.Minute, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if r := f.call(http.MethodPost, reservePath, tok, reserveBody("nadia-"+name, "k", 1)); r.status != http.StatusCreated {
			t.Fatalf("%s key: %d %s", name, r.status, r.body)
		}
	}
	tok, err := admission.Mint([]byte("another-key-0123456789"), testSKU, "nadia", time.Minute, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if r := f.call(http.MethodPost, reservePath, tok, reserveBody("nadia", "k2", 1)); r.status != http.StatusUnauthorized {
		t.Fatalf("another key: %d %s", r.status, r.body)
	}
}

// During a rotation the previous key is taken too: a buyer who reserved with
// a token signed with it checks out after the reserve pods rolled onto the
// new key. A key that is neither is refused; an expired token signed with the
// previous key is expired, not a bad signature.
func TestPreviousAdmissionKeyIsTakenDuringARotation(t *testing.T) {
	previous := []byte("the-previous-key-0123456789")
	f := newFixture(t, func(c *fixtureConfig) { c.api.AdmissionKeyPrevious = previous })
	for name, key := range map[string][]byte{"current": testKey, "previous": previous} {
		tok, err := admission.Mint(key, testSKU, "rosa-"+name, time.Minute, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if r := f.call(http.MethodPost, reservePath, tok, reserveBody("rosa-"+name, "k", 1)); r.status != http.StatusCreated {
			t.Fatalf("a token signed with the %s key: %d %s", name, r.status, r.body)
		}
	}
	for name, c := range map[string]struct {
		key  []byte
		ttl  time.Duration
		want string
	}{
		"another key":           {[]byte("another-key-0123456789"), 2 * time.Hour, "signature is invalid"},
		"previous key, expired": {previous, time.Second, "expired"},
	} {
		tok, err := admission.Mint(c.key, testSKU, "rosa", c.ttl, time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if r := f.call(http.MethodPost, reservePath, tok, reserveBody("rosa", "k2", 1)); r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), c.want) {
			t.Fatalf("%s: %d %s, want 401 saying %q", name, r.status, r.body, c.want)
		}
	}
	if _, err := New(Config{Engine: f.e, AdmissionKey: testKey, AdmissionKeyPrevious: []byte("short")}); err == nil || !strings.Contains(err.Error(), "previous admission key") {
		t.Fatalf("a short previous key: %v, want an error naming it", err)
	}
}
