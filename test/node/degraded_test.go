package node_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// condition reads one condition of the sale as "status reason
// lastTransitionTime", and its message.
func condition(t *testing.T, ns, name, typ string) (fields []string, message string) {
	t.Helper()
	q := fmt.Sprintf(`{.status.conditions[?(@.type=="%s")]`, typ)
	out := kubectl(t, nil, "get", "flashsale", name, "-n", ns, "-o", "jsonpath="+q+".status} "+q+".reason} "+q+".lastTransitionTime}|"+q+".message}")
	f, msg, _ := strings.Cut(out, "|")
	return strings.Fields(f), msg
}

// Two reserve replicas at the OOM test's limit (oomLimit), and a storm sent
// to one of them only, at its pod address: the kernel kills that one at its
// limit again and again, the other stays idle (ready inside the limit, as
// the OOM test shows) and keeps the sale Ready. The FlashSale says it:
// Degraded True, reason OOMKilled, naming the pod and its restarts, with a
// ReplicaCrashing event, while Ready never leaves True (its transition time
// does not move). The crashing pod deleted, its replacement runs and
// Degraded is False again.
//
// Both replicas have the same limit (a Deployment's pods share one
// template); only where the load goes differs, and the test puts it there.
func TestOneReplicaOOMKilledIsReportedWhileTheSaleStaysReady(t *testing.T) {
	needNode(t)
	storms.Lock()
	defer storms.Unlock()
	ns, name := "degraded", "degraded"
	newShop(t, ns)
	s := applySale(t, ns, map[string]any{"Name": name, "Allocation": 100000, "Replicas": 2,
		"Memory": oomLimit, "Limit": oomLimit, "TTL": "10s", "Grace": "2s", "SweepInterval": "1s"})
	kubectl(t, nil, "rollout", "status", "deployment/"+name+"-reserve", "-n", ns, "--timeout=170s")
	reserve := pods(t, ns, "reserve")
	if len(reserve) != 2 {
		t.Fatalf("%d reserve pods, want 2", len(reserve))
	}
	victim, other := reserve[0].Metadata.Name, reserve[1].Metadata.Name
	ip := strings.TrimSpace(kubectl(t, nil, "get", "pod", victim, "-n", ns, "-o", "jsonpath={.status.podIP}"))
	if net.ParseIP(ip) == nil {
		t.Fatalf("pod %s has no address: %q", victim, ip)
	}
	kubectl(t, nil, "wait", "-n", ns, "--for=condition=Degraded=false", "flashsale/"+name, "--timeout=60s")
	ready, _ := condition(t, ns, name, "Ready")
	if len(ready) != 3 || ready[0] != "True" {
		t.Fatalf("Ready before the storm: %v", ready)
	}

	// The storm reaches the victim only; bounded by its duration, cut short
	// once the test has seen what it waits for.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := env.Command(ctx, env.Binary, "storm", "--json", "--quiet", "--audit=false", "--sku", s.sku, "--key-file", s.keyFile,
		"--url", "http://"+net.JoinHostPort(ip, strconv.Itoa(config.PortHTTP)),
		"--buyers", "100000", "--count", "100000", "--duration", "90s", "--concurrency", "16", "--checkout-ratio", "0.3", "--cancel-ratio", "0.1")
	cmd.Env = os.Environ()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Closed once the storm's process is gone: waited for here and on any
	// way out of the test.
	stormDone := make(chan struct{})
	go func() {
		_ = cmd.Wait() // cut short or not, its answers are not what is tested
		close(stormDone)
	}()
	defer func() {
		cancel()
		<-stormDone
	}()

	var degraded []string
	var message string
	eventuallyWithin(t, 3*time.Minute, "the loaded replica OOM-killed twice and Degraded naming it, the sale Ready", func() bool {
		select {
		case <-stormDone:
			t.Fatalf("the storm ended first: %s", stderr.String())
		default:
		}
		if r, _ := condition(t, ns, name, "Ready"); len(r) != 3 || r[0] != "True" {
			t.Fatalf("Ready left True while one replica crashed: %v (%s)", r, kubectl(t, nil, "get", "flashsale", name, "-n", ns, "-o",
				`jsonpath={.status.conditions[?(@.type=="Ready")].message}`))
		}
		var restarts int
		for _, p := range pods(t, ns, "reserve") {
			if len(p.Status.ContainerStatuses) == 0 {
				continue
			}
			cs := p.Status.ContainerStatuses[0]
			switch p.Metadata.Name {
			case other:
				if cs.RestartCount != 0 {
					t.Fatalf("the idle replica %s restarted (%d, last %+v): the premise does not hold", other, cs.RestartCount, cs.LastState.Terminated)
				}
			case victim:
				if last := cs.LastState.Terminated; last != nil && last.Reason != "OOMKilled" {
					t.Fatalf("pod %s ended %s (exit %d), want OOMKilled", victim, last.Reason, last.ExitCode)
				}
				restarts = cs.RestartCount
			}
		}
		degraded, message = condition(t, ns, name, "Degraded")
		return restarts >= 2 && len(degraded) == 3 && degraded[0] == "True" && degraded[1] == "OOMKilled" &&
			strings.Contains(message, "pod "+victim+": OOMKilled (exit code 137)") && !strings.Contains(message, " 0 restarts") &&
			!strings.Contains(message, other)
	})
	cancel()
	<-stormDone
	t.Logf("Degraded %v: %s", degraded, message)
	if ev := kubectl(t, nil, "get", "events", "-n", ns, "--field-selector", "involvedObject.name="+name+",reason=ReplicaCrashing",
		"-o", "jsonpath={.items[*].message}"); !strings.Contains(ev, victim) {
		t.Fatalf("no ReplicaCrashing event naming %s: %q", victim, ev)
	}

	// The crashing pod replaced: Degraded False, and Ready never moved.
	kubectl(t, nil, "delete", "pod", victim, "-n", ns, "--wait=false")
	kubectl(t, nil, "wait", "-n", ns, "--for=condition=Degraded=false", "flashsale/"+name, "--timeout=120s")
	if now, _ := condition(t, ns, name, "Ready"); len(now) != 3 || now[0] != "True" || now[2] != ready[2] {
		t.Fatalf("Ready %v, True since %s before the storm: it moved while one replica crashed", now, ready[2])
	}
	if ev := kubectl(t, nil, "get", "events", "-n", ns, "--field-selector", "involvedObject.name="+name+",reason=ReplicasRecovered",
		"-o", "jsonpath={.items[*].message}"); ev == "" {
		t.Fatal("no ReplicasRecovered event")
	}
}
