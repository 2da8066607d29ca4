package node_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The node runs on cgroup v1 (this machine kind has no v2 memory
// controller) with the cgroupfs driver: the kubelet's tree is
// /sys/fs/cgroup/memory/<cgroup root>/kubepods[/<qos>]/pod<uid>/<container id>,
// the cgroup root being named after the cluster's directory
// (internal/testharness). In v1, memory.max_usage_in_bytes is what v2 calls
// memory.peak, and memory.oom_control counts the kernel's OOM kills.

// memCgroups are the memory cgroups of a pod: its pod-level one and the
// current one of its first container.
type memCgroups struct{ pod, container string }

func podMemCgroups(t *testing.T, ns, pod string) memCgroups {
	t.Helper()
	f := strings.Fields(kubectl(t, nil, "get", "pod", pod, "-n", ns, "-o",
		"jsonpath={.metadata.uid} {.status.containerStatuses[0].containerID}"))
	if len(f) != 2 {
		t.Fatalf("pod %s/%s has no running container yet: %q", ns, pod, f)
	}
	uid, cid := f[0], strings.TrimPrefix(f[1], "containerd://")
	root := filepath.Join("/sys/fs/cgroup/memory", filepath.Base(env.Cluster.Dir), "kubepods")
	var cg memCgroups
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil // a cgroup removed while walking
		}
		if d.Name() == "pod"+uid {
			cg.pod = path
			return fs.SkipAll
		}
		return nil
	})
	if err != nil || cg.pod == "" {
		t.Fatalf("no memory cgroup for pod %s/%s (uid %s) under %s: %v", ns, pod, uid, root, err)
	}
	cg.container = filepath.Join(cg.pod, cid)
	if _, err := os.Stat(cg.container); err != nil {
		t.Fatalf("container cgroup of %s/%s: %v", ns, pod, err)
	}
	return cg
}

// cgroupPIDs lists the processes of a cgroup (as this machine's kernel
// numbers them, not the container's namespace).
func cgroupPIDs(t *testing.T, dir string) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// cgroupInt reads a cgroup file holding one number.
func cgroupInt(t *testing.T, dir, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s/%s: %v", dir, file, err)
	}
	return n
}

// cgroupKeyed reads a "key value" cgroup file (memory.stat, memory.oom_control).
func cgroupKeyed(t *testing.T, dir, file string) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				m[k] = n
			}
		}
	}
	return m
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
