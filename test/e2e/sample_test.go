package e2e_test

import (
	"path/filepath"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// The README's sale: the samples from config/samples, applied with kubectl
// (the Secrets with this machine's addresses, the FlashSale as it is), stormed,
// then the status columns, the storm's audit and the ledger must agree.
// test/node has the same case on a real node.
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
	s.check().StatusAgrees(t, ledger, rep, 10)
}
