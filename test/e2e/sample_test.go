package e2e_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// The README's sale: the samples from config/samples, applied with kubectl
// (the Secrets with this machine's addresses, the FlashSale as it is), stormed,
// then the status columns, the storm's audit and the ledger must agree.
func TestSamplesStormAndStatusAgreeWithTheLedger(t *testing.T) {
	t.Parallel()
	storms.Lock()
	defer storms.Unlock()
	ns := namespaceName("samples")
	samples := filepath.Join(testharness.RepoRoot(), "config", "samples")
	kubectl(t, nil, "create", "namespace", ns)
	for _, f := range []string{"secret_shop-redis.yaml", "secret_shop-ledger.yaml", "secret_waiting-room.yaml"} {
		manifest, _, err := localenv.RenderSecret(filepath.Join(samples, f), env.SecretValues())
		if err != nil {
			t.Fatal(err)
		}
		kubectl(t, manifest, "apply", "-n", ns, "-f", "-")
	}
	kubectl(t, nil, "apply", "-n", ns, "-f", filepath.Join(samples, "flashsale_v1alpha1_flashsale.yaml"))
	t.Cleanup(func() { kubectl(t, nil, "delete", "flashsale", "ps5-drop", "-n", ns, "--timeout=60s") })
	s := waitReady(t, ns, "ps5-drop")

	rep := s.storm(t, "--buyers", "5000", "--checkout-ratio", "0.5", "--cancel-ratio", "0.1")
	salecheck.Audit(t, rep)
	a := rep.Audit
	if a.Allocation != 1000 || rep.Confirmed == 0 || rep.Cancelled == 0 || rep.Abandoned == 0 {
		t.Fatalf("the storm did not exercise the sale: allocation %d, %d confirmed, %d cancelled, %d abandoned",
			a.Allocation, rep.Confirmed, rep.Cancelled, rep.Abandoned)
	}

	// The sample's reservations last 10 minutes: nothing expires during the
	// test, so the figures stay put once the controller has refreshed them.
	var cols []string
	eventually(t, 20*time.Second, 250*time.Millisecond, func() string {
		cols = strings.Fields(kubectl(t, nil, "get", "flashsale", "ps5-drop", "-n", ns, "-o",
			"jsonpath={.status.phase} {.status.allocation} {.status.available} {.status.reserved} {.status.sold}"))
		if len(cols) != 5 || atoi(t, cols[2]) != a.Available || atoi(t, cols[3]) != a.Reserved || atoi(t, cols[4]) != a.Sold {
			return "status " + strings.Join(cols, " ") + " does not match the audit yet"
		}
		return ""
	})
	if cols[0] != "SoldOut" && cols[0] != "Open" {
		t.Errorf("phase %s after the storm", cols[0])
	}
	units := salecheck.Units(t, ledger, s.uid)
	if units["COMMITTED"] != a.Sold || units["PENDING"] != a.Reserved || units["ABANDONED"] != 0 {
		t.Errorf("ledger %v; status and audit: sold %d, reserved %d", units, a.Sold, a.Reserved)
	}
	if units["CANCELLED_BY_USER"] != int64(rep.Cancelled) {
		t.Errorf("ledger has %d units cancelled by buyers, the storm cancelled %d", units["CANCELLED_BY_USER"], rep.Cancelled)
	}
	if atoi(t, cols[1])-a.Sold-a.Reserved != a.Available {
		t.Errorf("status allocation %s - sold %d - reserved %d != available %d", cols[1], a.Sold, a.Reserved, a.Available)
	}

	// The printer columns show the same figures.
	row := strings.Fields(kubectl(t, nil, "get", "flashsales", "-n", ns, "--no-headers"))
	want := []string{"ps5-drop", "itm-ps5-pro", cols[0], "True", "1000", cols[2], cols[3], cols[4]}
	if len(row) < len(want) || strings.Join(row[:len(want)], " ") != strings.Join(want, " ") {
		t.Errorf("kubectl get flashsales: %q, want it to start with %q", row, want)
	}
	// Per-shard figures add up to the totals.
	fs := getSale(t, ns, "ps5-drop")
	var avail, reserved int64
	for _, sh := range fs.Status.Shards {
		avail += sh.Available
		reserved += sh.Reserved
	}
	if len(fs.Status.Shards) != 10 || avail != fs.Status.Available || reserved != fs.Status.Reserved {
		t.Errorf("%d shards sum to available %d, reserved %d; totals %d, %d", len(fs.Status.Shards), avail, reserved, fs.Status.Available, fs.Status.Reserved)
	}
}
