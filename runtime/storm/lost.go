package storm

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// heldEntry is one reservation of the buyer's list (api.HeldReservation).
type heldEntry struct {
	ReservationID string    `json:"reservation_id"`
	Quantity      int       `json:"quantity"`
	Status        string    `json:"status"`
	ExpiresAt     time.Time `json:"expires_at"`
}

// findLost is a buyer who lost the answer to its reservation request, and
// the request's idempotency key with it: a new key would take another unit
// (or meet its limit), so it lists what it holds instead. The storm knows
// which reservation the lost answer named, and checks that the list shows
// it held, as answered, while it is held. It reports whether the buyer
// found it.
func (s *stormer) findLost(ctx context.Context, st *workerStats, home int, token, user string, got answer) bool {
	a := s.call(ctx, st, OpList, home, http.MethodGet, heldPath, token, "")
	if a.status != http.StatusOK {
		return false // no list (a 503, a transport error): the reservation lapses
	}
	for _, h := range a.held {
		if h.ReservationID != got.reservationID {
			continue
		}
		if h.Status != "reserved" || h.Quantity != s.cfg.Quantity || !h.ExpiresAt.Equal(got.expiresAt.Truncate(time.Millisecond)) {
			st.listViolations = append(st.listViolations, fmt.Sprintf("user %s: %s answered held for %d until %s, listed %s for %d until %s",
				user, got.reservationID, s.cfg.Quantity, got.expiresAt.UTC().Format(time.RFC3339Nano),
				h.Status, h.Quantity, h.ExpiresAt.UTC().Format(time.RFC3339Nano)))
			return false
		}
		st.recovered++
		return true
	}
	// Past its expiry the sweeper may have released it, and then it is no
	// longer listed: the list was read at the latest when its answer came.
	if a.doneAt.Add(clockSlack).Before(got.expiresAt) {
		st.listViolations = append(st.listViolations, fmt.Sprintf("user %s: %s, held until %s, is not in the list of %d reservations answered at %s",
			user, got.reservationID, got.expiresAt.UTC().Format(time.RFC3339Nano), len(a.held), a.doneAt.UTC().Format(time.RFC3339Nano)))
	}
	return false
}
