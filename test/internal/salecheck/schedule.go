package salecheck

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

// phaseTimeout bounds waiting for the controller to move a sale's phase.
const phaseTimeout = 60 * time.Second

// ScheduledDrop drives a drop of 10 units that opens at start, from before
// its start: 425 NOT_STARTED until the start, 201 from then on; paused, 503
// PAUSED, and a reservation taken before the pause is still paid for; once
// its end (moved to a few seconds away) has passed, 410 ENDED and, with
// nothing left reserved, the phase Completed with the one unit sold.
func (s *Sale) ScheduledDrop(t testing.TB, start time.Time) {
	t.Helper()
	if phase := s.Get(t).Status.Phase; phase != flashsalev1alpha1.PhaseScheduled {
		t.Fatalf("phase %s before the start, want Scheduled", phase)
	}
	alice := s.Buyer(t, "alice")

	// Before the start every attempt is refused; from the start it succeeds.
	var reservation string
	notStarted := 0
	for i := 0; reservation == ""; i++ {
		a := alice.Reserve(t, fmt.Sprintf("attempt-%d", i))
		now := time.Now()
		switch {
		case a.Status == http.StatusTooEarly && a.Code == "NOT_STARTED":
			notStarted++
			if now.After(start.Add(10 * time.Second)) {
				t.Fatalf("still NOT_STARTED %v after the start", now.Sub(start))
			}
		case a.Status == http.StatusCreated:
			if now.Before(start) {
				t.Fatalf("reserved %v before the start", start.Sub(now))
			}
			reservation = a.ReservationID
			t.Logf("first reservation %v after the start", now.Sub(start).Round(time.Millisecond))
		default:
			t.Fatalf("reserve: %+v", a)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if notStarted == 0 {
		t.Fatal("the sale became Ready only after its start: the test saw no NOT_STARTED")
	}
	s.WaitPhase(t, flashsalev1alpha1.PhaseOpen, phaseTimeout)

	// The status says Paused once every shard's gate is closed.
	s.Patch(t, `{"paused":true}`)
	s.WaitPhase(t, flashsalev1alpha1.PhasePaused, phaseTimeout)
	if a := s.Buyer(t, "bob").Reserve(t, "while-paused"); a.Status != http.StatusServiceUnavailable || a.Code != "PAUSED" {
		t.Fatalf("reserve while paused: %+v", a)
	}
	// A reservation taken before the pause can still be paid for.
	if a := alice.Checkout(t, reservation); a.Status != http.StatusOK {
		t.Fatalf("checkout while paused: %+v", a)
	}

	end := time.Now().Add(2 * time.Second).UTC().Truncate(time.Second).Add(time.Second)
	s.Patch(t, fmt.Sprintf(`{"schedule":{"end":%q}}`, end.Format(time.RFC3339)))
	carol := s.Buyer(t, "carol")
	Eventually(t, 30*time.Second, 200*time.Millisecond, func() string {
		a := carol.Reserve(t, "after-the-end")
		if a.Status != http.StatusGone || a.Code != "ENDED" {
			return fmt.Sprintf("reserve after the end: %+v", a)
		}
		if time.Now().Before(end) {
			t.Fatalf("ENDED %v before the end", time.Until(end))
		}
		return ""
	})
	s.WaitPhase(t, flashsalev1alpha1.PhaseCompleted, phaseTimeout)
	fs := s.Get(t)
	if fs.Status.Sold != 1 || fs.Status.Reserved != 0 || fs.Status.Available != 9 {
		t.Errorf("completed with available %d, reserved %d, sold %d; want 9, 0, 1", fs.Status.Available, fs.Status.Reserved, fs.Status.Sold)
	}
}
