package ledger

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

func latePayments(t *testing.T, l *Ledger, id string) []string {
	t.Helper()
	rows, err := l.Pool().Query(testCtx(t), sqlTestLatePayments, id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestGetOrderNotFound(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	if _, err := l.GetOrder(testCtx(t), "c", "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetOrder(unknown): %v", err)
	}
}

func TestCheckout(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	other := newCampaign(t, l, 100, 2)
	o := insertOrder(t, l, pendingOrder(c, "alice", 1, 0), time.Hour)

	check := func(campaign, id, user, token string, want CheckoutOutcome) Order {
		t.Helper()
		got, order, err := l.Checkout(ctx, campaign, id, user, token)
		if err != nil {
			t.Fatalf("Checkout(%s, %s, %s): %v", id, user, token, err)
		}
		if got != want {
			t.Fatalf("Checkout(%s, %s, %s) = %v, want %v", id, user, token, got, want)
		}
		return order
	}

	// Another user, another campaign, an unknown id: not found, and the row is untouched.
	if got := check(c.ID, o.ReservationID, "mallory", "pay-m", CheckoutNotFound); got != (Order{}) {
		t.Errorf("not-found checkout revealed %+v", got)
	}
	check(other.ID, o.ReservationID, "alice", "pay-1", CheckoutNotFound)
	check(c.ID, "no-such-reservation", "alice", "pay-1", CheckoutNotFound)
	mustStatus(t, l, o.ReservationID, StatusPending)
	if lp := latePayments(t, l, o.ReservationID); len(lp) != 0 {
		t.Errorf("late payments for a not-found checkout: %v", lp)
	}

	got := check(c.ID, o.ReservationID, "alice", "pay-1", CheckoutCommitted)
	if got.Status != StatusCommitted || got.PaymentToken != "pay-1" || got.Shard != 1 {
		t.Errorf("committed order %+v", got)
	}
	check(c.ID, o.ReservationID, "alice", "pay-1", CheckoutAlreadyCommitted)
	if lp := latePayments(t, l, o.ReservationID); len(lp) != 0 {
		t.Errorf("late payments for a paid reservation: %v", lp)
	}
	for range 2 { // a second payment is recorded for voiding, once
		if got := check(c.ID, o.ReservationID, "alice", "pay-2", CheckoutConflict); got.PaymentToken != "pay-1" {
			t.Errorf("conflict changed the token: %+v", got)
		}
	}
	if lp := latePayments(t, l, o.ReservationID); !slices.Equal(lp, []string{"COMMITTED"}) {
		t.Errorf("late payments after a second payment: %v", lp)
	}
	check(c.ID, o.ReservationID, "mallory", "pay-1", CheckoutNotFound)
	stored, _ := l.GetOrder(ctx, o.CampaignID, o.ReservationID)
	if stored.PaymentToken != "pay-1" {
		t.Errorf("stored token %q", stored.PaymentToken)
	}

	if _, _, err := l.Checkout(ctx, c.ID, o.ReservationID, "alice", ""); err == nil {
		t.Error("empty payment token accepted")
	}
}

// I7: a payment after expiry never commits; it is recorded for voiding.
func TestCheckoutAfterExpiry(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	o := insertOrder(t, l, pendingOrder(c, "bob", 0, 0), -time.Second)

	for range 2 { // a retried late payment is recorded once
		got, order, err := l.Checkout(ctx, c.ID, o.ReservationID, "bob", "pay-late")
		if err != nil || got != CheckoutExpired {
			t.Fatalf("Checkout after expiry = %v, %v", got, err)
		}
		if order.Status != StatusPending {
			t.Errorf("expired order reported as %s", order.Status)
		}
	}
	mustStatus(t, l, o.ReservationID, StatusPending)
	if lp := latePayments(t, l, o.ReservationID); !slices.Equal(lp, []string{"PENDING"}) {
		t.Fatalf("late payments %v", lp)
	}
	if got, _, _ := l.Checkout(ctx, c.ID, o.ReservationID, "bob", "pay-late-2"); got != CheckoutExpired {
		t.Fatalf("second token: %v", got)
	}
	if lp := latePayments(t, l, o.ReservationID); len(lp) != 2 {
		t.Fatalf("late payments %v, want two tokens", lp)
	}
	// Another user's late payment is not recorded against this reservation.
	if got, _, _ := l.Checkout(ctx, c.ID, o.ReservationID, "eve", "pay-eve"); got != CheckoutNotFound {
		t.Fatalf("other user after expiry: %v", got)
	}

	// Cancelled and abandoned rows answer expired too, with the status recorded.
	for _, st := range []Status{StatusCancelledByUser, StatusCancelledBySweeper, StatusAbandoned} {
		r := pendingOrder(c, "bob", 1, 0)
		r.Status = st
		r = insertOrder(t, l, r, time.Hour)
		got, _, err := l.Checkout(ctx, c.ID, r.ReservationID, "bob", "pay-x")
		if err != nil || got != CheckoutExpired {
			t.Fatalf("checkout of %s row = %v, %v", st, got, err)
		}
		mustStatus(t, l, r.ReservationID, st)
		if lp := latePayments(t, l, r.ReservationID); !slices.Equal(lp, []string{string(st)}) {
			t.Errorf("late payments for %s row: %v", st, lp)
		}
	}
}

// sqlTestRearmExpiries sets the expiry of each order ($2) to its offset in
// milliseconds ($3) from the database's now.
const sqlTestRearmExpiries = `UPDATE flashsale_orders o
SET expires_at = now() + t.ms * interval '1 millisecond'
FROM unnest($2::text[], $3::integer[]) AS t(id, ms)
WHERE o.campaign_id = $1 AND o.reservation_id = t.id`

// Checkout racing the sweeper at the expiry edge: every row ends COMMITTED
// (and was committed before it expired) or CANCELLED_BY_SWEEPER, and each
// caller's answer matches the row. How many land on each side depends on how
// fast this machine runs the checkouts; a race with no row on one side
// proves nothing about the edge, so it runs again (every race's rows are
// checked), up to five times.
func TestCheckoutRacingSweeper(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	for attempt := 1; ; attempt++ {
		committed, cancelled := raceCheckoutsWithSweepers(t, l)
		t.Logf("race %d: %d committed before expiry, %d cancelled by the sweeper", attempt, committed, cancelled)
		if t.Failed() || committed > 0 && cancelled > 0 {
			return
		}
		if attempt == 5 {
			t.Fatalf("edge not exercised in %d races: the last had %d committed, %d cancelled", attempt, committed, cancelled)
		}
	}
}

// raceCheckoutsWithSweepers runs one race on a campaign of its own, checks
// every row and answer, and counts the rows on each side of the edge.
func raceCheckoutsWithSweepers(t *testing.T, l *Ledger) (committed, cancelled int) {
	ctx := testCtx(t)
	c := newCampaign(t, l, 10_000, 4)
	const n = 300
	orders := make([]Order, n)
	ids := make([]string, n)
	offsets := make([]int32, n)
	for i := range orders {
		orders[i] = insertOrder(t, l, pendingOrder(c, uniqueID("user"), i%4, 0), time.Hour)
		ids[i], offsets[i] = orders[i].ReservationID, int32(150+i)
	}
	// Expiries spread over 150–450 ms from now by the database clock, set in
	// one statement once every row exists: on a busy machine the 300 inserts
	// alone can take longer than that.
	if _, err := l.Pool().Exec(ctx, sqlTestRearmExpiries, c.ID, ids, offsets); err != nil {
		t.Fatal(err)
	}
	outcomes := make([]CheckoutOutcome, n)
	var wg sync.WaitGroup
	for i, o := range orders {
		wg.Go(func() {
			time.Sleep(time.Duration(rand.IntN(600)) * time.Millisecond)
			got, _, err := l.Checkout(ctx, c.ID, o.ReservationID, o.UserID, "pay-"+o.ReservationID)
			if err != nil {
				t.Error(err)
			}
			outcomes[i] = got
		})
	}
	for range 4 { // several sweepers, grace 0
		wg.Go(func() {
			for end := time.Now().Add(800 * time.Millisecond); time.Now().Before(end); {
				if _, err := l.CancelExpired(ctx, c.ID, ids, 0); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if _, err := l.CancelExpired(ctx, c.ID, ids, 0); err != nil { // the last pass after every checkout
		t.Fatal(err)
	}

	for i, id := range ids {
		o, err := l.GetOrder(ctx, c.ID, id)
		if err != nil {
			t.Fatal(err)
		}
		switch o.Status {
		case StatusCommitted:
			committed++
			if outcomes[i] != CheckoutCommitted {
				t.Errorf("%s committed but the caller was told %v", id, outcomes[i])
			}
			if !o.UpdatedAt.Before(o.ExpiresAt) {
				t.Errorf("%s committed at %v, after its expiry %v (I7)", id, o.UpdatedAt, o.ExpiresAt)
			}
		case StatusCancelledBySweeper:
			cancelled++
			if outcomes[i] != CheckoutExpired {
				t.Errorf("%s cancelled but the caller was told %v", id, outcomes[i])
			}
			if len(latePayments(t, l, id)) != 1 {
				t.Errorf("%s: refused payment not recorded", id)
			}
		default:
			t.Errorf("%s ended %s", id, o.Status)
		}
	}
	return committed, cancelled
}

func TestCancelByUser(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	row := func(st Status) Order {
		o := pendingOrder(c, "carol", 0, 0)
		o.Status = st
		if st == StatusCommitted {
			o.PaymentToken = "pay"
		}
		return insertOrder(t, l, o, time.Hour)
	}
	cancel := func(id, user string, want CancelOutcome) Order {
		t.Helper()
		got, o, err := l.CancelByUser(ctx, c.ID, id, user)
		if err != nil || got != want {
			t.Fatalf("CancelByUser(%s, %s) = %v, %v; want %v", id, user, got, err, want)
		}
		return o
	}

	p := row(StatusPending)
	cancel(p.ReservationID, "mallory", CancelNotFound)
	mustStatus(t, l, p.ReservationID, StatusPending)
	if o := cancel(p.ReservationID, "carol", CancelCancelled); o.Status != StatusCancelledByUser {
		t.Errorf("cancelled order %+v", o)
	}
	cancel(p.ReservationID, "carol", CancelAlreadyCancelled)
	cancel(row(StatusCommitted).ReservationID, "carol", CancelCommitted)
	cancel(row(StatusCancelledBySweeper).ReservationID, "carol", CancelGone)
	cancel(row(StatusAbandoned).ReservationID, "carol", CancelGone)
	cancel("no-such-reservation", "carol", CancelNotFound)
	if got, _, _ := l.CancelByUser(ctx, "other-campaign", row(StatusPending).ReservationID, "carol"); got != CancelNotFound {
		t.Errorf("cancel through another campaign: %v", got)
	}

	// Expired but not yet swept: the user may still cancel.
	old := pendingOrder(c, "carol", 1, 0)
	old = insertOrder(t, l, old, -time.Minute)
	cancel(old.ReservationID, "carol", CancelCancelled)
}

func TestCancelExpired(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	other := newCampaign(t, l, 100, 2)
	const grace = 10 * time.Minute
	pastGrace := insertOrder(t, l, pendingOrder(c, "u", 0, 0), -time.Hour)
	inGrace := insertOrder(t, l, pendingOrder(c, "u", 0, 0), -time.Minute)
	valid := insertOrder(t, l, pendingOrder(c, "u", 1, 0), time.Hour)
	paid := pendingOrder(c, "u", 1, 0)
	paid.Status, paid.PaymentToken = StatusCommitted, "pay"
	paid = insertOrder(t, l, paid, -time.Hour)
	foreign := insertOrder(t, l, pendingOrder(other, "u", 0, 0), -time.Hour)
	ids := []string{pastGrace.ReservationID, inGrace.ReservationID, valid.ReservationID, paid.ReservationID,
		foreign.ReservationID, "no-such-reservation"}

	want := map[string]Status{
		pastGrace.ReservationID: StatusCancelledBySweeper,
		inGrace.ReservationID:   StatusPending,
		valid.ReservationID:     StatusPending,
		paid.ReservationID:      StatusCommitted,
	}
	// Two sweepers at once: one cancels the row and says so; the other sees
	// it cancelled, or PENDING when its statement began before that cancel
	// committed (it skips it, and releases nothing).
	var wg sync.WaitGroup
	got := make([]map[string]Status, 2)
	for i := range got {
		wg.Go(func() {
			var err error
			if got[i], err = l.CancelExpired(ctx, c.ID, ids, grace); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	cancellers := 0
	for i := range got {
		switch got[i][pastGrace.ReservationID] {
		case StatusCancelledBySweeper:
			cancellers++
		case StatusPending:
			got[i][pastGrace.ReservationID] = StatusCancelledBySweeper // for the comparison below
		}
		if !mapsEqual(got[i], want) {
			t.Errorf("sweeper %d saw %v, want %v", i, got[i], want)
		}
	}
	if cancellers == 0 {
		t.Errorf("neither sweeper saw the expired row cancelled: %v", got)
	}
	mustStatus(t, l, foreign.ReservationID, StatusPending)

	// With no grace the row inside the grace window goes too.
	again, err := l.CancelExpired(ctx, c.ID, ids, 0)
	if err != nil {
		t.Fatal(err)
	}
	if again[inGrace.ReservationID] != StatusCancelledBySweeper || again[valid.ReservationID] != StatusPending {
		t.Errorf("grace 0: %v", again)
	}
	if m, err := l.CancelExpired(ctx, c.ID, nil, 0); err != nil || len(m) != 0 {
		t.Errorf("no ids: %v %v", m, err)
	}
}

// A sweeper's cancel that waits for a row held by another writer (a
// checkout, another sweeper, a buyer's cancel) reads that row PENDING, as
// its statement's snapshot has it, never cancelled by itself: the sweeper
// skips it this pass. The rest of its batch is cancelled as usual.
func TestCancelExpiredAfterWaitingForAnotherWriter(t *testing.T) {
	t.Parallel()
	for _, w := range []struct {
		name, sql string
		after     Status
	}{
		{"a checkout", `UPDATE flashsale_orders SET status = 'COMMITTED', payment_token = 'pay', updated_at = now()
WHERE reservation_id = $1`, StatusCommitted},
		{"another sweeper", `UPDATE flashsale_orders SET status = 'CANCELLED_BY_SWEEPER', updated_at = now()
WHERE reservation_id = $1`, StatusCancelledBySweeper},
		{"a buyer's cancel", `UPDATE flashsale_orders SET status = 'CANCELLED_BY_USER', updated_at = now()
WHERE reservation_id = $1`, StatusCancelledByUser},
	} {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			dsn := newDSN(t, testPG)
			l := openLedger(t, dsn)
			ctx := testCtx(t)
			c := newCampaign(t, l, 100, 2)
			held := insertOrder(t, l, pendingOrder(c, "u", 0, 0), -time.Minute)
			other := insertOrder(t, l, pendingOrder(c, "v", 1, 0), -time.Minute)
			blocker := holdLock(t, l, w.sql, held.ReservationID)
			type result struct {
				got map[string]Status
				err error
			}
			done := make(chan result, 1)
			go func() {
				got, err := l.CancelExpired(ctx, c.ID, []string{held.ReservationID, other.ReservationID}, 0)
				done <- result{got, err}
			}()
			testharness.WaitForLockWaiters(t, dsn, 1, 30*time.Second, "the cancel to wait for the held row")
			if err := blocker.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			// PENDING as the statement's snapshot had it: the sweeper skips
			// it this pass, and the next one reads it ended.
			if s := r.got[held.ReservationID]; s != StatusPending {
				t.Errorf("the held row read %q, want PENDING (then %q in the ledger)", s, w.after)
			}
			if s := r.got[other.ReservationID]; s != StatusCancelledBySweeper {
				t.Errorf("the other row read %q, want CANCELLED_BY_SWEEPER", s)
			}
			mustStatus(t, l, held.ReservationID, w.after)
			mustStatus(t, l, other.ReservationID, StatusCancelledBySweeper)
		})
	}
}

func mapsEqual(a, b map[string]Status) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestRecordAbandoned(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	m := l.NewMaterializer(MaterializerConfig{})
	defer m.Close()

	materialized := pendingOrder(c, "u", 0, time.Hour)
	if err := m.Submit(ctx, materialized); err != nil {
		t.Fatal(err)
	}
	lost := []Order{pendingOrder(c, "u", 0, -time.Minute), pendingOrder(c, "v", 1, -time.Minute), materialized}

	// Two sweepers record the same reservations at once: each row is
	// written once, and counted by the one that wrote it.
	var wg sync.WaitGroup
	got := make([]map[string]Status, 2)
	wrote := make([]int, 2)
	for i := range got {
		wg.Go(func() {
			var err error
			if got[i], wrote[i], err = l.RecordAbandoned(ctx, lost); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if wrote[0]+wrote[1] != 2 {
		t.Errorf("the sweepers wrote %d and %d rows, want 2 in all", wrote[0], wrote[1])
	}
	want := map[string]Status{
		lost[0].ReservationID:      StatusAbandoned,
		lost[1].ReservationID:      StatusAbandoned,
		materialized.ReservationID: StatusPending, // the late writer won: do not release
	}
	for i := range got {
		if !mapsEqual(got[i], want) {
			t.Errorf("sweeper %d saw %v, want %v", i, got[i], want)
		}
	}
	stored, err := l.GetOrder(ctx, lost[1].CampaignID, lost[1].ReservationID)
	if err != nil || stored.UserID != "v" || stored.Shard != 1 || stored.PaymentToken != "" {
		t.Errorf("abandoned row %+v %v", stored, err)
	}
	// A materializer arriving after the sweeper finds the row taken.
	if err := m.Submit(ctx, lost[0]); !errors.Is(err, ErrDuplicate) {
		t.Errorf("late materialize of an abandoned reservation: %v", err)
	}
	mustStatus(t, l, lost[0].ReservationID, StatusAbandoned)
}
