package node_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"text/template"

	"sigs.k8s.io/yaml"

	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// newShop makes a namespace with the sale's Secrets (pointing at the
// forwarded Redis and ledger) enforcing the restricted Pod Security Standard.
func newShop(t *testing.T, ns string) {
	t.Helper()
	kubectl(t, nil, "create", "namespace", ns)
	kubectl(t, nil, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
	samples := filepath.Join(testharness.RepoRoot(), "config", "samples")
	for _, f := range []string{"secret_shop-redis.yaml", "secret_shop-ledger.yaml", "secret_waiting-room.yaml"} {
		manifest, _, err := localenv.RenderSecret(filepath.Join(samples, f), env.SecretValues())
		if err != nil {
			t.Fatal(err)
		}
		kubectl(t, manifest, "apply", "-n", ns, "-f", "-")
	}
	t.Cleanup(func() { kubectl(t, nil, "delete", "namespace", ns, "--timeout=120s") })
}

// ownRedis starts a Redis for one sale of namespace ns (one the test may
// kill, flush or restart without touching another sale), forwards it into
// the node, and creates the Secret own-redis that points the sale's pods at
// it (testdata/sale.yaml's RedisSecret). It returns the Redis and where the
// pods reach it.
func ownRedis(t *testing.T, ns string) (own *testharness.Redis, podAddr string) {
	t.Helper()
	own, err := env.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	if podAddr, err = env.PodAddr(own.Addr()); err != nil {
		t.Fatal(err)
	}
	kubectl(t, nil, "create", "secret", "generic", "own-redis", "-n", ns, "--from-literal=addresses="+podAddr)
	return own, podAddr
}

// applySale renders testdata/sale.yaml and waits for the sale to be Ready.
func applySale(t *testing.T, ns string, vars map[string]any) *sale {
	t.Helper()
	tmpl, err := template.ParseFiles(filepath.Join("testdata", "sale.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, vars); err != nil {
		t.Fatal(err)
	}
	kubectl(t, b.Bytes(), "apply", "-n", ns, "-f", "-")
	name := vars["Name"].(string)
	t.Cleanup(func() { kubectl(t, nil, "delete", "flashsale", name, "-n", ns, "--ignore-not-found", "--timeout=120s") })
	return waitReady(t, ns, name)
}

// documentedCodes are the HTTP status codes docs/openapi.yaml gives any
// operation.
func documentedCodes(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testharness.RepoRoot(), "docs", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]any `json:"responses"`
		} `json:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	codes := map[string]bool{}
	for _, ops := range doc.Paths {
		for _, op := range ops {
			for code := range op.Responses {
				codes[code] = true
			}
		}
	}
	if !codes["201"] || !codes["409"] {
		t.Fatalf("docs/openapi.yaml documents %v: no 201 or 409, the parse is wrong", codes)
	}
	return codes
}

// undocumented lists the storm's HTTP answers outside the documented codes,
// and apart from them its transport errors ("ERR ..." outcomes: no answer).
func undocumented(rep *storm.Report, codes map[string]bool) (answers, transport []string) {
	for op, m := range rep.Outcomes {
		for label, n := range m {
			switch {
			case n == 0 || codes[label]:
			case strings.HasPrefix(label, "ERR "):
				transport = append(transport, fmt.Sprintf("%s %s x%d", op, label, n))
			default:
				answers = append(answers, fmt.Sprintf("%s %s x%d", op, label, n))
			}
		}
	}
	sort.Strings(answers)
	sort.Strings(transport)
	return answers, transport
}

// A spec change rolls the reserve Deployment (the real Deployment controller,
// one pod at a time, readiness and preStop honoured) while a storm goes
// through the Service: no acknowledged reservation is lost and every HTTP
// answer is a documented one, and every request gets an answer.
func TestRollingRestartUnderStormLosesNothing(t *testing.T) {
	needNode(t)
	storms.Lock()
	defer storms.Unlock()
	ns := "rollout"
	newShop(t, ns)
	s := applySale(t, ns, map[string]any{"Name": "roll", "Allocation": 100000, "Replicas": 3, "Memory": "64Mi"})
	deploy := "deployment/roll-reserve"
	before := strings.TrimSpace(kubectl(t, nil, "get", deploy, "-n", ns, "-o", "jsonpath={.metadata.generation}"))
	codes := documentedCodes(t)

	type result struct {
		rep *storm.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := s.runStorm("--buyers", "100000", "--count", "100000", "--duration", "60s", "--concurrency", "32",
			"--checkout-ratio", "0.3", "--cancel-ratio", "0.1")
		done <- result{rep, err}
	}()
	// The rollout starts once the storm's first reservation is in.
	eventually(t, "the storm's first reservation", func() bool {
		out, err := env.Kubectl(t.Context(), nil, "get", "flashsale", "roll", "-n", ns, "-o", "jsonpath={.status.reserved} {.status.sold}")
		f := strings.Fields(out)
		return err == nil && len(f) == 2 && (f[0] != "0" || f[1] != "0")
	})
	kubectl(t, nil, "patch", "flashsale", "roll", "-n", ns, "--type", "merge", "-p",
		`{"spec":{"reservation":{"resources":{"requests":{"memory":"72Mi"}}}}}`)
	eventually(t, "the operator writing the spec change into the reserve Deployment", func() bool {
		out, err := env.Kubectl(t.Context(), nil, "get", deploy, "-n", ns, "-o", "jsonpath={.metadata.generation}")
		return err == nil && strings.TrimSpace(out) != before
	})
	kubectl(t, nil, "rollout", "status", deploy, "-n", ns, "--timeout=170s")
	// The old pods finish terminating (preStop, grace) after the rollout.
	eventually(t, "only reserve pods of the new template", func() bool {
		req := kubectl(t, nil, "get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=reserve", "-o", "jsonpath={.items[*].spec.containers[0].resources.requests.memory}")
		return strings.Join(strings.Fields(req), " ") == "72Mi 72Mi 72Mi"
	})
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	rep := res.rep
	logStorm(t, rep)
	salecheck.Audit(t, rep)
	answers, transport := undocumented(rep, codes)
	if len(answers) > 0 {
		t.Errorf("answers outside docs/openapi.yaml during the rollout: %v (outcomes %v)", answers, rep.Outcomes)
	}
	// A request on a kept-alive connection to a stopping pod used to get no
	// answer when its shutdown closed the idle connections (about 20 of
	// 65,000). Stopping pods now close each connection with an answer first.
	if len(transport) > 0 {
		t.Errorf("connections without an answer during the rollout: %v", transport)
	}
}
