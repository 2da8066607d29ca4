package api

import (
	"net/http"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A retry of a reservation whose 201 was lost, sent once the sale is paused
// or has ended, gets the reservation back (200, the same body): it is held,
// and checkout takes it. It used to get 503 PAUSED or 410 ENDED, and a
// client that follows the codes told its buyer the sale was closed to them.
// A new request still gets the closed answer.
func TestARetryWhilePausedOrEndedGetsItsReservation(t *testing.T) {
	f := newFixture(t, withAllocation(10), withShards(1), withMaxPerUser(1))
	for _, tc := range []struct {
		gate   string
		status int
		code   Code
	}{
		{stock.StatePaused, http.StatusServiceUnavailable, CodePaused},
		{stock.StateEnded, http.StatusGone, CodeEnded},
	} {
		t.Run(tc.gate, func(t *testing.T) {
			f.setGate(stock.StateOpen)
			user := "u-" + tc.gate
			held := f.reserve(user, "k", 1)
			f.setGate(tc.gate)
			r := f.call(http.MethodPost, reservePath, f.token(user), reserveBody(user, "k", 1))
			var got ReservationBody
			if r.status != http.StatusOK {
				t.Fatalf("the retry while %s: %d %s; want 200 and its reservation", tc.gate, r.status, r.body)
			}
			if r.decode(t, &got); got != held {
				t.Fatalf("the retry while %s: %+v; want %+v", tc.gate, got, held)
			}
			other := "new-" + tc.gate
			n := f.call(http.MethodPost, reservePath, f.token(other), reserveBody(other, "k", 1))
			if e := n.errorBody(t); n.status != tc.status || e.Code != tc.code {
				t.Fatalf("a new request while %s: %d %s; want %d %s", tc.gate, n.status, n.body, tc.status, tc.code)
			}
			if c := f.checkout(user, held.ReservationID, "pay-"+tc.gate); c.status != http.StatusOK {
				t.Fatalf("checkout while %s: %d %s", tc.gate, c.status, c.body)
			}
		})
	}
}
