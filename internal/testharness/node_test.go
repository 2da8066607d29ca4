package testharness

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// restrictedPod is what the restricted Pod Security Standard asks of a pod,
// with a memory limit that must land in its cgroup.
const restrictedPod = `apiVersion: v1
kind: Pod
metadata:
  name: restricted
spec:
  automountServiceAccountToken: true
  securityContext:
    runAsNonRoot: true
    runAsUser: 65535
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: pause
    image: ` + PauseImage + `
    imagePullPolicy: Never
    resources:
      limits: {memory: 64Mi, cpu: 100m}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
---
apiVersion: v1
kind: Service
metadata:
  name: restricted
spec:
  selector: {app: none}
  ports: [{port: 80}]
`

// hostRules counts this machine's iptables rules and chains of the kinds the
// node makes (kube-proxy's KUBE-*, the CNI plugins' CNI-*).
func hostRules(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("iptables-save").Output()
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "KUBE-") || strings.Contains(l, "CNI-") {
			n++
		}
	}
	return n
}

// The node runs a restricted pod under the kubelet (its memory limit in its
// cgroup), kube-proxy programs the Service network inside the node's
// namespace only, a loopback server is reachable from inside at NodeIP, and
// Stop leaves no mount, network namespace, link, iptables rule, cgroup or
// process behind.
func TestClusterRunsARestrictedPodAndLeavesNothingBehind(t *testing.T) {
	if err := NodeSupported(); errors.Is(err, ErrNodeUnsupported) {
		t.Skip(err)
	}
	rulesBefore := hostRules(t)
	r, _ := Shared(t)
	c, err := StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kubectl := func(stdin string, args ...string) string {
		t.Helper()
		var in []byte
		if stdin != "" {
			in = []byte(stdin)
		}
		out, err := c.Kubectl(ctx, in, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	kubectl(restrictedPod, "apply", "-n", "default", "-f", "-")
	kubectl("", "wait", "-n", "default", "--for=condition=Ready", "pod/restricted", "--timeout=150s")
	uid := strings.TrimSpace(kubectl("", "get", "pod", "restricted", "-n", "default", "-o", "jsonpath={.metadata.uid}"))
	if _, err := c.Kubectl(ctx, nil, "logs", "-n", "default", "restricted"); err != nil {
		t.Errorf("kubectl logs (the API server reaching the kubelet at %s): %v", c.NodeIP, err)
	}
	// Every component's output is in logs/, for KeepLogs.
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd", "kubelet", "kube-proxy"} {
		if fi, err := os.Stat(filepath.Join(c.Dir, "logs", name+".log")); err != nil || fi.Size() == 0 {
			t.Errorf("%s's log: %v (empty or missing)", name, err)
		}
	}

	// The memory limit is the pod's cgroup's.
	limits, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory", c.cgroupRoot, "kubepods*", "*pod"+uid, "memory.limit_in_bytes"))
	if len(limits) == 0 {
		limits, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup/memory", c.cgroupRoot, "kubepods*", "*", "*pod"+uid, "memory.limit_in_bytes"))
	}
	if len(limits) != 1 {
		t.Errorf("no memory cgroup for pod %s under %s", uid, c.cgroupRoot)
	} else if b, _ := os.ReadFile(limits[0]); strings.TrimSpace(string(b)) != "67108864" {
		t.Errorf("%s = %s, want 67108864 (64Mi)", limits[0], b)
	}

	// kube-proxy's rules are inside the node's namespace, none out here.
	Eventually(t, time.Minute, "kube-proxy's KUBE-SERVICES chain in the node's namespace", func() bool {
		out, _ := c.Command(ctx, "iptables-save").Output()
		return strings.Contains(string(out), "KUBE-SERVICES")
	})
	if n := hostRules(t); n != rulesBefore {
		t.Errorf("this machine's KUBE-/CNI- iptables lines went from %d to %d", rulesBefore, n)
	}

	// A server on this machine's loopback, reached from inside at NodeIP.
	addr, err := c.Expose(r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(addr, ":")
	if out, err := c.Command(ctx, "redis-cli", "-h", host, "-p", port, "PING").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "PONG" {
		t.Errorf("redis-cli PING at %s from inside the node: %v %s", addr, err, out)
	}

	// What must be gone afterwards.
	pids := map[int]string{}
	for name, pid := range c.ComponentPIDs() {
		pids[pid] = name
	}
	for _, pid := range c.OwnedPIDs() {
		pids[pid] = "container or shim"
	}
	if len(c.PodPIDs()) < 2 {
		t.Errorf("pod processes %v: want the sandbox and the container", c.PodPIDs())
	}
	if len(MountsUnder(c.Dir)) == 0 {
		t.Errorf("no mount under %s while a pod runs: the check below would prove nothing", c.Dir)
	}
	dir, netns, link, cgroups, socks := c.Dir, c.Netns, c.net.host, append([]string(nil), c.cgroupDirs...), c.sockDir

	stopped = true
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if m := MountsUnder(dir); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if _, err := os.Stat(netns); !os.IsNotExist(err) {
		t.Errorf("network namespace %s left (%v)", netns, err)
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), filepath.Base(netns)) {
		t.Errorf("ip netns list still shows %s", filepath.Base(netns))
	}
	Eventually(t, 10*time.Second, "link "+link+" gone", func() bool { return !linkExists(link) })
	if n := hostRules(t); n != rulesBefore {
		t.Errorf("this machine's KUBE-/CNI- iptables lines went from %d to %d", rulesBefore, n)
	}
	for pid, what := range pids {
		if live, _ := procState(pid); live && syscall.Kill(pid, 0) == nil {
			t.Errorf("pid %d (%s) still alive", pid, what)
		}
	}
	for _, d := range cgroups {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left", d)
		}
	}
	if left, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", filepath.Base(dir))); len(left) > 0 {
		t.Errorf("cgroups left: %v", left)
	}
	for _, d := range []string{dir, socks} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s left", d)
		}
	}
}

// Only loopback servers are forwarded into a node: anything else is refused
// before a listener opens.
func TestExposeRefusesNonLoopbackTargets(t *testing.T) {
	for _, target := range []string{"10.0.0.1:6379", "example.com:80", "nonsense"} {
		if _, err := newForwarder("/nonexistent", "127.0.0.1:0", target); err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("newForwarder to %q: %v, want a loopback-only error", target, err)
		}
	}
}
