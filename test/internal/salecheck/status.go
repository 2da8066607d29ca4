package salecheck

import (
	"fmt"
	"strings"
	"testing"
	"time"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
)

// StatusAgrees waits for the sale's status to show the figures of the
// storm's audit (the controller refreshes them), then fails the test unless
// the phase, the printer columns of `kubectl get flashsales`, the per-shard
// figures (shards of them) and the ledger agree with it. The storm must
// have confirmed, cancelled and abandoned reservations. The sale's
// reservations must outlive the test (nothing expires meanwhile).
func (s *Sale) StatusAgrees(t testing.TB, q Querier, rep *storm.Report, shards int) {
	t.Helper()
	a := rep.Audit
	if a.Allocation != s.Get(t).Spec.Allocation || rep.Confirmed == 0 || rep.Cancelled == 0 || rep.Abandoned == 0 {
		t.Fatalf("the storm did not exercise the sale: allocation %d, %d confirmed, %d cancelled, %d abandoned",
			a.Allocation, rep.Confirmed, rep.Cancelled, rep.Abandoned)
	}
	var fs *flashsalev1alpha1.FlashSale
	Eventually(t, 30*time.Second, 250*time.Millisecond, func() string {
		fs = s.Get(t)
		if st := fs.Status; st.Available != a.Available || st.Reserved != a.Reserved || st.Sold != a.Sold {
			return fmt.Sprintf("status available %d, reserved %d, sold %d does not match the audit's %d, %d, %d yet",
				st.Available, st.Reserved, st.Sold, a.Available, a.Reserved, a.Sold)
		}
		return ""
	})
	st := fs.Status
	if st.Phase != flashsalev1alpha1.PhaseSoldOut && st.Phase != flashsalev1alpha1.PhaseOpen {
		t.Errorf("phase %s after the storm", st.Phase)
	}
	units := Units(t, q, s.UID)
	if units["COMMITTED"] != a.Sold || units["PENDING"] != a.Reserved || units["ABANDONED"] != 0 {
		t.Errorf("ledger %v; status and audit: sold %d, reserved %d", units, a.Sold, a.Reserved)
	}
	if units["CANCELLED_BY_USER"] != int64(rep.Cancelled) {
		t.Errorf("ledger has %d units cancelled by buyers, the storm cancelled %d", units["CANCELLED_BY_USER"], rep.Cancelled)
	}
	if st.Allocation-a.Sold-a.Reserved != a.Available {
		t.Errorf("status allocation %d - sold %d - reserved %d != available %d", st.Allocation, a.Sold, a.Reserved, a.Available)
	}

	// The printer columns show the same figures.
	row := strings.Fields(s.kubectl(t, "get", "flashsales", s.Name, "-n", s.NS, "--no-headers"))
	want := strings.Fields(fmt.Sprintf("%s %s %s True %d %d %d %d", s.Name, s.SKU, st.Phase, st.Allocation, st.Available, st.Reserved, st.Sold))
	if len(row) < len(want) || strings.Join(row[:len(want)], " ") != strings.Join(want, " ") {
		t.Errorf("kubectl get flashsales: %q, want it to start with %q", row, want)
	}
	// Per-shard figures add up to the totals.
	var avail, reserved int64
	for _, sh := range st.Shards {
		avail += sh.Available
		reserved += sh.Reserved
	}
	if len(st.Shards) != shards || avail != st.Available || reserved != st.Reserved {
		t.Errorf("%d shards sum to available %d, reserved %d; totals %d, %d", len(st.Shards), avail, reserved, st.Available, st.Reserved)
	}
}
