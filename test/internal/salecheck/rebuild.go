package salecheck

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
)

// Held are reservations buyers hold across a fault, by buyer.
type Held map[*Buyer]string

// Hold has n buyers reserve one unit each and fails the test unless every
// one was acknowledged.
func (s *Sale) Hold(t testing.TB, n int) Held {
	t.Helper()
	held := Held{}
	for i := range n {
		b := s.Buyer(t, fmt.Sprintf("holder-%d", i))
		a := b.Reserve(t, "before-the-fault")
		if a.Status != http.StatusCreated {
			t.Fatalf("%s reserving before the fault: %+v", b.User, a)
		}
		held[b] = a.ReservationID
	}
	return held
}

// RebuiltAfterLoss waits (up to timeout) for the sale to be rebuilt from
// the ledger after its Redis lost everything: a new epoch, Open again, the
// rebuild recorded in status, FailClosed seen by the phase watch, a
// RedisDataLost event. Then the reservations held across the loss are paid
// for (they were restored with the stock). It returns the rebuild's time.
func (s *Sale) RebuiltAfterLoss(t testing.TB, phases *PhaseWatch, held Held, timeout time.Duration) time.Time {
	t.Helper()
	var rebuiltAt time.Time
	Eventually(t, timeout, 100*time.Millisecond, func() string {
		fs := s.Get(t)
		if fs.Status.LastRebuild == nil || fs.Status.Epoch < 2 || fs.Status.Phase != flashsalev1alpha1.PhaseOpen {
			return fmt.Sprintf("not rebuilt yet: phase %s, epoch %d, last rebuild %+v", fs.Status.Phase, fs.Status.Epoch, fs.Status.LastRebuild)
		}
		rebuiltAt = fs.Status.LastRebuild.Time.Time
		t.Logf("rebuilt: epoch %d, %+v", fs.Status.Epoch, *fs.Status.LastRebuild)
		return ""
	})
	Eventually(t, 10*time.Second, 100*time.Millisecond, func() string {
		if !slices.Contains(phases.Seen(), string(flashsalev1alpha1.PhaseFailClosed)) {
			return fmt.Sprintf("kubectl get -w never showed FailClosed; phases seen: %v", phases.Seen())
		}
		return ""
	})
	if ev := s.kubectl(t, "get", "events", "-n", s.NS, "--field-selector", "reason=RedisDataLost", "-o", "name"); strings.TrimSpace(ev) == "" {
		t.Error("no RedisDataLost event")
	}
	for b, id := range held {
		if a := b.Checkout(t, id); a.Status != http.StatusOK || a.OrderStatus != "confirmed" {
			t.Errorf("%s checking out %s, acknowledged before the loss: %+v", b.User, id, a)
		}
	}
	return rebuiltAt
}

// SettledAfterRebuild checks a sale rebuilt at rebuiltAt once the storm that
// ran across the loss of its Redis settled: its audit is exact with nothing
// left reserved, the storm went on after the rebuild, the held reservations
// (paid by RebuiltAfterLoss) are committed, and the ledger and the status
// agree with the audit.
func (s *Sale) SettledAfterRebuild(t testing.TB, q Querier, rep *storm.Report, rebuiltAt time.Time, held Held) {
	t.Helper()
	Audit(t, rep)
	if !rep.Audit.Settled || rep.Audit.Reserved != 0 || rep.Audit.Pending != 0 {
		t.Fatalf("not settled: reserved %d, pending %d", rep.Audit.Reserved, rep.Audit.Pending)
	}
	// The storm went on after the rebuild (whose time the status gives to
	// the second, hence the second added).
	if n := ordersSince(t, q, s.UID, rebuiltAt.Add(time.Second)); n == 0 {
		t.Error("no reservation was made after the rebuild: the storm did not go on")
	}
	ids := make([]string, 0, len(held))
	for _, id := range held {
		ids = append(ids, id)
	}
	statuses := Statuses(t, q, ids)
	for _, id := range ids {
		if statuses[id] != "COMMITTED" {
			t.Errorf("reservation %s held across the loss is %q in the ledger", id, statuses[id])
		}
	}
	units := Units(t, q, s.UID)
	wantSold := rep.Audit.Sold
	if units["COMMITTED"] != wantSold || units["PENDING"] != 0 {
		t.Errorf("ledger %v, audit sold %d", units, wantSold)
	}
	Eventually(t, 30*time.Second, 250*time.Millisecond, func() string {
		fs := s.Get(t)
		if fs.Status.Sold != wantSold || fs.Status.Reserved != 0 || fs.Status.Available != fs.Spec.Allocation-wantSold {
			return fmt.Sprintf("status available %d reserved %d sold %d, want sold %d of %d", fs.Status.Available, fs.Status.Reserved, fs.Status.Sold, wantSold, fs.Spec.Allocation)
		}
		return ""
	})
}

// OrdersAtLeast waits until the ledger holds at least n of the sale's
// orders: a fault meant to land mid-storm lands once the storm is writing,
// however long it took to start.
func OrdersAtLeast(t testing.TB, q Querier, uid string, n int64, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, 50*time.Millisecond, func() string {
		if got := ordersSince(t, q, uid, time.Time{}); got < n {
			return fmt.Sprintf("%d orders in the ledger, want at least %d", got, n)
		}
		return ""
	})
}

// ordersSince counts a sale's orders made after since.
func ordersSince(t testing.TB, q Querier, uid string, since time.Time) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	rows, err := q.Query(ctx, `SELECT count(*) FROM flashsale_orders WHERE campaign_id = $1 AND created_at > $2`, uid, since)
	if err != nil {
		t.Fatal(err)
	}
	n, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return n
}
