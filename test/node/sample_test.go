package node_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// The README's sale on a real node, in a namespace that enforces the
// restricted Pod Security Standard: every pod the operator writes is
// admitted, runs under the kubelet from the operator's image (non-root, read-
// only root file system) and turns Ready; `kubectl logs` reads a reserve
// pod; a storm through the Service (kube-proxy) passes its audit, and the
// status, the printer columns and the ledger agree with it (test/e2e's
// samples case, on the node).
func TestSamplesOnARealNode(t *testing.T) {
	needNode(t)
	storms.Lock()
	defer storms.Unlock()
	ns := "shop"
	samples := filepath.Join(testharness.RepoRoot(), "config", "samples")
	newShop(t, ns)
	kubectl(t, nil, "apply", "-n", ns, "-f", filepath.Join(samples, "flashsale_v1alpha1_flashsale.yaml"))
	t.Cleanup(func() { kubectl(t, nil, "delete", "flashsale", "ps5-drop", "-n", ns, "--timeout=120s") })
	s := waitReady(t, ns, "ps5-drop")

	// Every pod of the sale runs and is ready; none was refused admission.
	// The sale is Ready with one sweeper ready: the standby may still be
	// starting, so the pods are waited for first.
	kubectl(t, nil, "wait", "-n", ns, "--for=condition=Ready", "pod", "--all", "--timeout=120s")
	states := podStates(t, ns)
	reserve := 0
	for _, st := range states {
		f := strings.Fields(st)
		if len(f) != 4 || f[1] != "Running" || f[2] != "true" {
			t.Errorf("pod %q is not Running and ready", st)
		}
		if strings.Contains(f[0], "-reserve-") {
			reserve++
		}
	}
	if reserve != 3 {
		t.Errorf("%d reserve pods, want the sample's 3: %v", reserve, states)
	}
	events := kubectl(t, nil, "get", "events", "-n", ns, "-o", "jsonpath={.items[*].message}")
	if strings.Contains(events, "violates PodSecurity") {
		t.Errorf("pod security refused a pod: %s", events)
	}
	// The operator's own pod, from the image, as user 65532.
	version := strings.TrimSpace(kubectl(t, nil, "exec", "-n", localenv.ManagerNamespace, "deployment/flashsale-controller-manager", "--", "/flashsale", "version"))
	if version == "" {
		t.Error("kubectl exec of /flashsale version in the manager pod printed nothing")
	}
	pod := strings.Fields(states[0])[0]
	if logs := kubectl(t, nil, "logs", "-n", ns, pod); strings.TrimSpace(logs) == "" {
		t.Errorf("kubectl logs %s printed nothing", pod)
	}

	rep := s.storm(t, "--buyers", "3000", "--checkout-ratio", "0.5", "--cancel-ratio", "0.1")
	salecheck.Audit(t, rep)
	// Its reservations last 10 minutes: the figures stay put once the
	// controller has refreshed them.
	s.check().StatusAgrees(t, ledger, rep, 10)
}
