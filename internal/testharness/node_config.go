package testharness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// containerdConfig keeps every containerd path under dir. The CRI options are
// what this machine kind needs: restrict_oom_score_adj (the sandbox lacks
// CAP_SYS_RESOURCE: without it runc fails with "can't get final child's PID
// from pipe"), the pause image built locally, netns mounts under the state
// directory (so Stop finds every one), and cgroupfs.
func containerdConfig(dir, sockDir, cniConf string) string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = %[5]q
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = %[6]q
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    disable_apparmor = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = %[7]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(sockDir, "containerd.sock"),
		filepath.Join(sockDir, "containerd.sock.ttrpc"), filepath.Join(dir, "opt"), PauseImage, cniConf)
}

// cniConfig is the pod network: one bridge inside the node's namespace, its
// addresses from host-local with its state under the node's directory.
func cniConfig(ipamDir string) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "flashsale-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`, ipamDir, podCIDR)
}

// kubeletConfig: cgroup v1 with cgroupfs (this machine kind has v1), its own
// cgroup root so that nodes of concurrent test runs do not share one, no
// oom_score_adj changes (no CAP_SYS_RESOURCE), no eviction or image garbage
// collection (the disk is shared), anonymous access to its API so that the
// API server (which holds no kubelet client certificate) can read logs.
func kubeletConfig(c *Cluster) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %[1]q
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
containerRuntimeEndpoint: %[2]q
address: %[3]q
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
podLogsDir: %[4]q
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
oomScoreAdj: 0
failSwapOn: false
resolvConf: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
maxPods: 60
shutdownGracePeriod: 0s
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
registerNode: true
`, c.cgroupRoot, "unix://"+c.containerdSock(), c.NodeIP, filepath.Join(c.Dir, "pod-logs"))
}

// writeFiles writes each path -> content, making parents.
func writeFiles(files map[string]string) error {
	for path, content := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// cgroupV1Controllers are the mounted v1 hierarchies (one directory each
// under /sys/fs/cgroup; named ones such as name=systemd included).
func cgroupV1Controllers() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok || !strings.HasPrefix(post, "cgroup ") {
			continue
		}
		f := strings.Fields(pre)
		if len(f) > 4 && strings.HasPrefix(f[4], "/sys/fs/cgroup/") {
			dirs = append(dirs, f[4])
		}
	}
	return dirs, nil
}
