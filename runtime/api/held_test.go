package api

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

const heldPath = "/api/v1/flash-sale/reservations"

// held lists the token subject's reservations and insists on 200.
func (f *fixture) held(user string) []HeldReservation {
	f.t.Helper()
	r := f.call(http.MethodGet, heldPath, f.token(user), nil)
	if r.status != http.StatusOK {
		f.t.Fatalf("GET %s as %s: %d %s", heldPath, user, r.status, r.body)
	}
	var b HeldBody
	r.decode(f.t, &b)
	if b.Reservations == nil {
		f.t.Fatalf("GET %s as %s: %s, want a list, empty or not", heldPath, user, r.body)
	}
	return b.Reservations
}

// A buyer who lost a reservation's answer and its key finds the reservation
// in its own list, from the ledger, and pays for it with the listed id:
// each reservation held or paid, oldest first, the held ones with their
// expiry; nothing another buyer holds, nothing cancelled, and nothing sent
// to Redis.
func TestABuyerListsWhatItHoldsAndPaysForALostOne(t *testing.T) {
	f := newFixture(t, withAllocation(10), withShards(3), withMaxPerUser(2))
	first := f.reserve("ann", "key-1", 1)
	second := f.reserve("ann", "key-2", 1)
	if co := f.checkout("ann", first.ReservationID, "pay-1"); co.status != http.StatusOK {
		t.Fatalf("checkout: %d %s", co.status, co.body)
	}
	f.reserve("bob", "key-1", 1)
	cancelled := f.reserve("cat", "key-1", 1)
	if r := f.call(http.MethodDelete, cancelPath(cancelled.ReservationID), f.token("cat"), nil); r.status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}

	// ann's answers and keys are lost: a new key is refused at her limit.
	if r := f.call(http.MethodPost, reservePath, f.token("ann"), reserveBody("ann", "key-3", 1)); r.status != http.StatusConflict || r.errorBody(t).Code != CodeLimitExceeded {
		t.Fatalf("a new key at the limit: %d %s", r.status, r.body)
	}
	redisBefore := f.redisCmds.Load()
	got := f.held("ann")
	if n := f.redisCmds.Load() - redisBefore; n != 0 {
		t.Fatalf("listing sent %d commands to Redis", n)
	}
	want := []HeldReservation{
		{ReservationID: first.ReservationID, Quantity: 1, Status: "confirmed"},
		{ReservationID: second.ReservationID, Quantity: 1, Status: "reserved", ExpiresAt: second.ExpiresAt},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("ann holds %+v, want %+v", got, want)
	}
	if co := f.checkout("ann", got[1].ReservationID, "pay-2"); co.status != http.StatusOK {
		t.Fatalf("checkout of the listed reservation: %d %s", co.status, co.body)
	}
	if got := f.held("ann"); len(got) != 2 || got[1].Status != "confirmed" || got[1].ExpiresAt != "" {
		t.Fatalf("after paying, ann holds %+v", got)
	}
	if got := f.held("cat"); len(got) != 0 {
		t.Fatalf("cat cancelled hers and holds %+v", got)
	}
	if got := f.held("dan"); len(got) != 0 {
		t.Fatalf("dan never reserved and holds %+v", got)
	}
	if got := f.held("bob"); len(got) != 1 || got[0].Status != "reserved" {
		t.Fatalf("bob holds %+v", got)
	}
	f.assertConserved()
}

// Without a token, with a bad one or one for another item the list is
// refused, and it is read only: POST and DELETE on it are 405 naming GET.
func TestTheListIsTheTokenHolders(t *testing.T) {
	f := newFixture(t, withAllocation(10), withShards(2))
	f.reserve("ann", "key-1", 1)
	if r := f.call(http.MethodGet, heldPath, "", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("no token: %d %s", r.status, r.body)
	}
	if r := f.call(http.MethodGet, heldPath, "not-a-token", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("a bad token: %d %s", r.status, r.body)
	}
	if r := f.call(http.MethodGet, heldPath, f.tokenFor("itm-other", "ann", time.Minute), nil); r.status != http.StatusForbidden {
		t.Fatalf("a token for another item: %d %s", r.status, r.body)
	}
	for _, m := range []string{http.MethodPost, http.MethodDelete} {
		r := f.call(m, heldPath, f.token("ann"), nil)
		if r.status != http.StatusMethodNotAllowed || !strings.Contains(r.header.Get("Allow"), http.MethodGet) {
			t.Fatalf("%s %s: %d, Allow %q", m, heldPath, r.status, r.header.Get("Allow"))
		}
	}
}

// A held reservation past its expiry stays listed, with its expiry, until
// the sweeper releases it: a checkout of it is refused as expired, a cancel
// still takes it, and then it is gone from the list.
func TestAnExpiredReservationIsListedUntilReleased(t *testing.T) {
	f := newFixture(t, withAllocation(5), withTTL(time.Second))
	res := f.reserve("late", "k", 1)
	time.Sleep(1500 * time.Millisecond)
	if got := f.held("late"); len(got) != 1 || got[0].Status != "reserved" || got[0].ExpiresAt != res.ExpiresAt {
		t.Fatalf("past its expiry, late holds %+v, want its reservation until %s", got, res.ExpiresAt)
	}
	if r := f.checkout("late", res.ReservationID, "pay-late"); r.status != http.StatusGone {
		t.Fatalf("checkout past the expiry: %d %s", r.status, r.body)
	}
	if r := f.call(http.MethodDelete, cancelPath(res.ReservationID), f.token("late"), nil); r.status != http.StatusOK {
		t.Fatalf("cancel past the expiry: %d %s", r.status, r.body)
	}
	if got := f.held("late"); len(got) != 0 {
		t.Fatalf("after the cancel, late holds %+v", got)
	}
}
