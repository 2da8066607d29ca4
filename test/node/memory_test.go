package node_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// The sample's sizing (config/samples): a reserve replica that takes in
// 4,096 buyers at once asks 256Mi. Outside a cgroup its peak resident set
// at 4,096 buyers was 480–498 MiB with no Go memory limit, 255–258 MiB with
// one (docs/operations.md, "Capacity and sizing").
const (
	sampleBuyers = 4096
	sampleLimit  = "256Mi"
)

// A reserve replica under the sample's limit, serving as many buyers at
// once as the sample takes in, keeps to its limit: the kernel never kills
// it, the kubelet never restarts it, every buyer's connection is served,
// and the sale is exact. The Go runtime gets there by collecting more
// often as it nears nine tenths of the limit (the downward API passes the
// limit); without that, the heap of 4,096 connections at the GC target of
// 400 passes 256Mi and the kernel kills the replica.
//
// The container's own open-file limit must hold a socket per buyer too: a
// process that can open 1,024 files cannot take in 4,096 buyers whatever
// its maxInFlight (it warns at start), so the test reads it from /proc.
func TestReserveServingTheSamplesBuyersKeepsToItsMemoryLimit(t *testing.T) {
	needNode(t)
	// The storm's client and the pod (containerd passes its limit on to
	// containers) both need a socket per buyer; a process here cannot
	// raise its hard limit without CAP_SYS_RESOURCE.
	var files syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &files); err != nil {
		t.Fatal(err)
	}
	if files.Max < sampleBuyers+512 {
		t.Skipf("a process here may open %d files, too few for a storm of %d buyers and the pod that serves it", files.Max, sampleBuyers)
	}
	storms.Lock()
	defer storms.Unlock()
	ns := "memory"
	newShop(t, ns)
	s := applySale(t, ns, map[string]any{"Name": "mem", "Allocation": 1000000, "Replicas": 1,
		"Memory": "64Mi", "Limit": sampleLimit, "MaxInFlight": sampleBuyers,
		"TTL": "10s", "Grace": "2s", "SweepInterval": "1s"})
	kubectl(t, nil, "rollout", "status", "deployment/mem-reserve", "-n", ns, "--timeout=170s")
	reserve := pods(t, ns, "reserve")
	if len(reserve) != 1 {
		t.Fatalf("%d reserve pods, want 1", len(reserve))
	}
	name := reserve[0].Metadata.Name
	limit := resource.MustParse(sampleLimit)
	cg := podMemCgroups(t, ns, name)
	if got := cgroupInt(t, cg.container, "memory.limit_in_bytes"); got != limit.Value() {
		t.Fatalf("pod %s: its cgroup's memory.limit_in_bytes is %d, want the %s of its spec", name, got, sampleLimit)
	}
	pids := cgroupPIDs(t, cg.container)
	if len(pids) != 1 {
		t.Fatalf("pod %s: processes %v in its container's cgroup, want the reserve process alone", name, pids)
	}
	pid := pids[0]
	podFiles := openFileLimit(t, pid)
	if podFiles < sampleBuyers+256 {
		t.Fatalf("pod %s: the reserve process may open %d files, too few for %d buyers' sockets", name, podFiles, sampleBuyers)
	}
	kills := cgroupKeyed(t, cg.pod, "memory.oom_control")["oom_kill"]

	port, err := strconv.Atoi(strings.TrimSpace(kubectl(t, nil, "get", "pod", name, "-n", ns, "-o", "jsonpath={.spec.containers[0].ports[0].containerPort}")))
	if err != nil {
		t.Fatalf("pod %s's port: %v", name, err)
	}
	// Every buyer keeps its connection for the whole storm, so the most
	// connections seen established to the API's port is the buyers
	// connected at once (taken in, since the process may open a file for
	// each: checked above).
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mostOpen int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			mostOpen = max(mostOpen, connectionsTo(pid, port))
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	rep, err := s.runStorm("--buyers", "1000000", "--concurrency", strconv.Itoa(sampleBuyers), "--duration", "30s",
		"--checkout-ratio", "0.3", "--cancel-ratio", "0.1", "--settle", "90s")
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	logStorm(t, rep)

	p := pods(t, ns, "reserve")
	if len(p) != 1 || p[0].Metadata.Name != name || len(p[0].Status.ContainerStatuses) == 0 {
		t.Fatalf("reserve pods changed: %+v", p)
	}
	if cs := p[0].Status.ContainerStatuses[0]; cs.RestartCount != 0 {
		t.Fatalf("reserve pod %s restarted %d times (last %+v) serving %d buyers under %s", name, cs.RestartCount, cs.LastState.Terminated, sampleBuyers, sampleLimit)
	}
	if after := cgroupKeyed(t, cg.pod, "memory.oom_control")["oom_kill"]; after != kills {
		t.Fatalf("pod %s: the kernel killed %d processes at its %s limit", name, after-kills, sampleLimit)
	}
	stat := cgroupKeyed(t, cg.container, "memory.stat")
	t.Logf("pod %s under %s, %d files at most: %d buyers connected at most; peak %.1f MiB (page cache included), now %.1f MiB anonymous, %.1f MiB cache; %d charges refused at the limit",
		name, sampleLimit, podFiles, mostOpen, mib(cgroupInt(t, cg.pod, "memory.max_usage_in_bytes")),
		mib(stat["total_rss"]), mib(stat["total_cache"]), cgroupInt(t, cg.pod, "memory.failcnt"))
	// The premise: the buyers were in at once.
	if mostOpen < sampleBuyers {
		t.Fatalf("pod %s had at most %d connections to port %d, fewer than the %d buyers: the storm never had them in at once", name, mostOpen, port, sampleBuyers)
	}
	// A process killed or closing connections shows as a transport error
	// (refused, reset, cut before or during the answer). A 503 (a wait in
	// line past half the deadline) or the client's own timeout is what a
	// slow host may give, and not what this test is about.
	for op, codes := range rep.Outcomes {
		for code, n := range codes {
			if strings.HasPrefix(code, "ERR") && code != "ERR timeout" && code != "ERR cancelled" {
				t.Errorf("%s: %d requests %s", op, n, code)
			}
		}
	}
	salecheck.Audit(t, rep)
}

// openFileLimit is a process's soft limit on open files (/proc/PID/limits).
func openFileLimit(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				if f[0] == "unlimited" {
					return 1 << 30
				}
				n, err := strconv.Atoi(f[0])
				if err != nil {
					t.Fatalf("/proc/%d/limits: %q: %v", pid, line, err)
				}
				return n
			}
		}
	}
	t.Fatalf("/proc/%d/limits has no open files line:\n%s", pid, b)
	return 0
}

// connectionsTo counts the established TCP connections to port in a
// process's network namespace (/proc/PID/net/tcp and tcp6); 0 once the
// process is gone.
func connectionsTo(pid, port int) int {
	local := fmt.Sprintf(":%04X", port)
	n := 0
	for _, file := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, file))
		if err != nil {
			continue // gone, or no IPv6
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st ...; st 01 is ESTABLISHED.
			if f := strings.Fields(line); len(f) > 3 && strings.HasSuffix(f[1], local) && f[3] == "01" {
				n++
			}
		}
	}
	return n
}
