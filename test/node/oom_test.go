package node_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// pod is the part of a Pod the tests read.
type pod struct {
	Metadata struct {
		Name              string  `json:"name"`
		DeletionTimestamp *string `json:"deletionTimestamp"`
	} `json:"metadata"`
	Spec struct {
		Containers []struct {
			Resources struct {
				Limits map[string]string `json:"limits"`
			} `json:"resources"`
		} `json:"containers"`
	} `json:"spec"`
	Status struct {
		ContainerStatuses []struct {
			Ready        bool `json:"ready"`
			RestartCount int  `json:"restartCount"`
			State        struct {
				Terminated *terminated `json:"terminated"`
			} `json:"state"`
			LastState struct {
				Terminated *terminated `json:"terminated"`
			} `json:"lastState"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

type terminated struct {
	Reason   string `json:"reason"`
	ExitCode int    `json:"exitCode"`
}

// pods lists a namespace's pods of one component.
func pods(t *testing.T, ns, component string) []pod {
	t.Helper()
	var list struct {
		Items []pod `json:"items"`
	}
	out := kubectl(t, nil, "get", "pods", "-n", ns, "-l", "app.kubernetes.io/component="+component, "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// oomLimit is the reserve pod's memory limit: above what a reserve process
// holds once started (it becomes ready inside it), below what it must touch
// under load. The reserve runs with the Go GC target of 400 (its default,
// unless GOGC or FLASHSALE_GC_PERCENT is set, which the test checks) and a
// Go memory limit of nine tenths of the pod's, 10.8 MiB: the runtime
// collects as it nears that, but what a storm keeps live passes 12 MiB (a
// replica serving 16 buyers with that Go limit held 14 MiB of anonymous
// memory within 10 s), so the kernel kills it at its limit every run.
const oomLimit = "12Mi"

// A reserve replica serving a storm through the Service is OOM-killed by the
// kernel at its memory limit (its cgroup's, set by the kubelet from the
// pod's spec), again after each restart by the kubelet, until the kubelet
// backs off; the operator reports the sale without a ready reservation API
// meanwhile (Ready False, ReservationAPINotReady) and says why (Degraded
// True, OOMKilled, naming the pod). Every acknowledged
// reservation is in the ledger, the audit is exact, and once the limit is
// raised the sale is Ready and sells on, exact.
//
// The audits wait for quiescence (reservations expire in 10 s, the sweeper
// runs every second): a checkout killed between its ledger commit and its
// Redis step leaves the unit RESERVED in Redis and COMMITTED in the ledger,
// counted twice by the audit until the sweeper's next pass settles it from
// the paying mark the checkout left (before that mark, until the
// reservation's expiry: available + reserved + sold 6 above the allocation
// right after the storm, on the first runs).
func TestReserveOOMKilledAtItsLimitRestartsAndLosesNothing(t *testing.T) {
	needNode(t)
	storms.Lock()
	defer storms.Unlock()
	ns := "oom"
	newShop(t, ns)
	s := applySale(t, ns, map[string]any{"Name": "oom", "Allocation": 100000, "Replicas": 1,
		"Memory": oomLimit, "Limit": oomLimit, "TTL": "10s", "Grace": "2s", "SweepInterval": "1s"})
	kubectl(t, nil, "rollout", "status", "deployment/oom-reserve", "-n", ns, "--timeout=170s")
	reserve := pods(t, ns, "reserve")
	if len(reserve) != 1 {
		t.Fatalf("%d reserve pods, want 1", len(reserve))
	}
	name := reserve[0].Metadata.Name
	if vars := strings.Join(strings.Fields(kubectl(t, nil, "get", "pod", name, "-n", ns, "-o",
		"jsonpath={.spec.containers[0].env[*].name}")), " "); strings.Contains(vars, "GOGC") || strings.Contains(vars, "GC_PERCENT") || strings.Contains(vars, "GOMEMLIMIT") {
		t.Fatalf("the reserve pod sets the GC target (%s): the premise of oomLimit does not hold", vars)
	}
	// The node enforces the limit: the container's cgroup has it.
	limit := resource.MustParse(oomLimit)
	cg := podMemCgroups(t, ns, name)
	if got := cgroupInt(t, cg.container, "memory.limit_in_bytes"); got != limit.Value() {
		t.Fatalf("pod %s: its cgroup's memory.limit_in_bytes is %d, want the %s of its spec", name, got, oomLimit)
	}
	t.Logf("pod %s ready inside %s: cgroup usage %.1f MiB", name, oomLimit, mib(cgroupInt(t, cg.container, "memory.usage_in_bytes")))

	ackedFile := filepath.Join(t.TempDir(), "acked")
	type result struct {
		rep *storm.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := s.runStorm("--buyers", "100000", "--count", "100000", "--duration", "45s", "--concurrency", "16",
			"--checkout-ratio", "0.3", "--cancel-ratio", "0.1", "--acked-file", ackedFile, "--settle", "90s")
		done <- result{rep, err}
	}()
	// Killed, restarted, killed again: the kubelet then backs off, and the
	// sale has no ready reservation API for the backoff's 10 s at least.
	var kills int
	eventuallyWithin(t, 3*time.Minute, "the reserve pod OOM-killed twice and the sale reported without a reservation API", func() bool {
		p := pods(t, ns, "reserve")
		if len(p) != 1 || p[0].Metadata.Name != name || len(p[0].Status.ContainerStatuses) == 0 {
			t.Fatalf("reserve pods changed: %+v (the kubelet restarts the container, nothing replaces the pod)", p)
		}
		cs := p[0].Status.ContainerStatuses[0]
		if last := cs.LastState.Terminated; last != nil && (last.Reason != "OOMKilled" || last.ExitCode != 137) {
			t.Fatalf("reserve pod %s ended %s (exit %d), want OOMKilled (137)", name, last.Reason, last.ExitCode)
		}
		if cs.RestartCount < 2 {
			return false
		}
		kills = cs.RestartCount
		ready := strings.Fields(kubectl(t, nil, "get", "flashsale", "oom", "-n", ns, "-o",
			`jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].reason}`))
		return len(ready) == 2 && ready[0] == "False" && ready[1] == "ReservationAPINotReady"
	})
	t.Logf("pod %s OOM-killed, %d restarts; Ready: %s", name, kills,
		kubectl(t, nil, "get", "flashsale", "oom", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`))
	// Degraded says why: the pod, the kernel's kill.
	eventuallyWithin(t, 30*time.Second, "Degraded True, OOMKilled, naming the pod", func() bool {
		d, msg := condition(t, ns, "oom", "Degraded")
		return len(d) == 3 && d[0] == "True" && d[1] == "OOMKilled" && strings.Contains(msg, "pod "+name+": OOMKilled (exit code 137)")
	})
	// The kernel did it: the pod's memory cgroup (it outlives the
	// container's, where the kill itself is counted) refused charges at the
	// limit; containerd saw the cgroup's OOM event (the OOMKilled above).
	if got, fails := cgroupInt(t, cg.pod, "memory.limit_in_bytes"), cgroupInt(t, cg.pod, "memory.failcnt"); got != limit.Value() || fails == 0 {
		t.Fatalf("pod %s's memory cgroup: limit %d, %d charges refused; want %d and some", name, got, fails, limit.Value())
	} else {
		t.Logf("pod %s's memory cgroup: %d charges refused at its %s limit, peak %.1f MiB", name, fails, oomLimit, mib(cgroupInt(t, cg.pod, "memory.max_usage_in_bytes")))
	}
	if ev := kubectl(t, nil, "get", "events", "-n", ns, "--field-selector", "involvedObject.name="+name+",reason=BackOff",
		"-o", "jsonpath={.items[*].message}"); !strings.Contains(ev, "Back-off restarting failed container") {
		t.Fatalf("no BackOff event from the kubelet for %s: %q", name, ev)
	}

	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	logStorm(t, res.rep)
	salecheck.Audit(t, res.rep)
	salecheck.Acked(t, ledger, ackedFile, res.rep.Acked)

	// The limit raised: the sale is Ready and sells on, exact.
	kubectl(t, nil, "patch", "flashsale", "oom", "-n", ns, "--type", "merge", "-p",
		`{"spec":{"reservation":{"resources":{"requests":{"memory":"64Mi"},"limits":{"memory":"256Mi"}}}}}`)
	kubectl(t, nil, "rollout", "status", "deployment/oom-reserve", "-n", ns, "--timeout=170s")
	kubectl(t, nil, "wait", "-n", ns, "--for=condition=Ready", "flashsale/oom", "--timeout=170s")
	// The killed pod is gone with the rollout: no replica crashes.
	kubectl(t, nil, "wait", "-n", ns, "--for=condition=Degraded=false", "flashsale/oom", "--timeout=60s")
	// The new replica's Go runtime keeps to nine tenths of its limit (the
	// downward API gave it the limit).
	eventuallyWithin(t, 60*time.Second, "the replica under a 256Mi limit logs its Go memory limit, 241591910 bytes", func() bool {
		for _, p := range pods(t, ns, "reserve") {
			if p.Metadata.DeletionTimestamp == nil && len(p.Spec.Containers) == 1 && p.Spec.Containers[0].Resources.Limits["memory"] == "256Mi" {
				logs := kubectl(t, nil, "logs", p.Metadata.Name, "-n", ns)
				return strings.Contains(logs, `"msg":"Go memory limit set"`) && strings.Contains(logs, `"bytes":241591910,"containerLimit":268435456`)
			}
		}
		return false
	})
	salecheck.Audit(t, s.storm(t, "--buyers", "100000", "--count", "1000", "--concurrency", "16", "--checkout-ratio", "0.3", "--settle", "90s"))
}
