package testharness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// stopGrace is how long a component gets after SIGTERM.
const stopGrace = 10 * time.Second

// Stop stops everything the cluster started and removes what it made: the
// pods' processes (killed through their cgroups), containerd's shims, every
// mount under Dir (container root file systems, volumes, the pods' network
// namespaces), the node's network namespace with its link and its iptables
// rules, the kubelet's cgroups and Dir itself. Calls after the first return
// its result.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		unregister(c)
		c.stopErr = c.stop()
	})
	return c.stopErr
}

func (c *Cluster) stop() error {
	var errs []error
	for _, f := range c.fwd {
		_ = f.close()
	}
	// The kubelet first, so that it restarts nothing while the pods go.
	errs = append(errs, c.stopProc("kubelet"))
	errs = append(errs, c.killCgroupTree())
	if p := c.proc("containerd"); p != nil && !p.exited() {
		c.removeContainers()
	}
	for _, name := range []string{"kube-proxy", "kube-scheduler", "kube-controller-manager", "containerd"} {
		errs = append(errs, c.stopProc(name))
	}
	if c.Dir != "" {
		errs = append(errs, killMatching(c.ownedBy))
		errs = append(errs, unmountUnder(c.Dir))
	}
	if c.Kube != nil {
		errs = append(errs, c.Kube.Stop())
	}
	if c.net != nil {
		errs = append(errs, c.net.remove())
	}
	// runc also makes the pods' cgroups in hierarchies the kubelet was not
	// given a root in (the unified one of a hybrid layout).
	if c.cgroupRoot != "" {
		all, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", c.cgroupRoot))
		c.cgroupDirs = all
	}
	errs = append(errs, c.removeCgroups())
	if c.sockDir != "" {
		errs = append(errs, os.RemoveAll(c.sockDir))
	}
	if c.Dir != "" {
		errs = append(errs, os.RemoveAll(c.Dir))
	}
	return errors.Join(errs...)
}

func (c *Cluster) proc(name string) *namedProc {
	for _, p := range c.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

func (c *Cluster) stopProc(name string) error {
	p := c.proc(name)
	if p == nil {
		return nil
	}
	if err := p.stop(syscall.SIGTERM, stopGrace); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// cgroupProcs lists the processes in every cgroup under the kubelet's root.
func (c *Cluster) cgroupProcs() []int {
	seen := map[int]bool{}
	for _, root := range c.cgroupDirs {
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids
}

// PodPIDs are the processes of the node's containers and sandboxes.
func (c *Cluster) PodPIDs() []int { return c.cgroupProcs() }

// killCgroupTree SIGKILLs every process of every pod until none is left.
func (c *Cluster) killCgroupTree() error {
	deadline := time.Now().Add(stopGrace)
	for {
		pids := c.cgroupProcs()
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod processes %v still alive after SIGKILL", pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeContainers deletes every container and its task, so that the shims
// exit and containerd unmounts the root file systems.
func (c *Cluster) removeContainers() {
	ctr := func(args ...string) string {
		out, _ := exec.Command("ctr", append([]string{"--address", c.containerdSock(), "-n", "k8s.io"}, args...)...).Output()
		return string(out)
	}
	for _, id := range strings.Fields(ctr("containers", "ls", "-q")) {
		ctr("tasks", "delete", "-f", id)
		ctr("containers", "delete", id)
	}
}

// ownedBy tells whether pid is one of the cluster's: a shim of its
// containerd, or a process running from or in its directory.
func (c *Cluster) ownedBy(pid int) bool {
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if c.sockDir != "" && bytes.Contains(cmdline, []byte(c.containerdSock())) {
		return true
	}
	if c.Dir == "" {
		return false
	}
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); strings.HasPrefix(exe, c.Dir+"/") {
		return true
	}
	cwd := procCwd(pid)
	return cwd == c.Dir || strings.HasPrefix(cwd, c.Dir+"/")
}

// OwnedPIDs are the live processes that belong to the cluster besides its
// components (shims, containers).
func (c *Cluster) OwnedPIDs() []int {
	var pids []int
	for _, pid := range livePIDs() {
		if pid != os.Getpid() && c.ownedBy(pid) {
			pids = append(pids, pid)
		}
	}
	return append(pids, c.cgroupProcs()...)
}

// ComponentPIDs are the PIDs of the components the harness started.
func (c *Cluster) ComponentPIDs() map[string]int {
	m := map[string]int{}
	for _, p := range c.procs {
		m[p.name] = p.pid()
	}
	return m
}

func livePIDs() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			if live, _ := procState(pid); live {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// killMatching SIGKILLs, until none is left, every live process owned says is
// the cluster's.
func killMatching(owned func(pid int) bool) error {
	deadline := time.Now().Add(stopGrace)
	for {
		var left []int
		for _, pid := range livePIDs() {
			if pid != os.Getpid() && owned(pid) {
				left = append(left, pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still alive after SIGKILL", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// MountsUnder lists the mount points at or below dir, deepest first.
func MountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	return mounts
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount at or below dir, deepest first, until
// none is left (a mount may be stacked on another).
func unmountUnder(dir string) error {
	for range 10 {
		mounts := MountsUnder(dir)
		if len(mounts) == 0 {
			return nil
		}
		for _, m := range mounts {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	if left := MountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("mounts left under %s: %v", dir, left)
	}
	return nil
}

func (c *Cluster) removeCgroups() error {
	var errs []error
	for _, root := range c.cgroupDirs {
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Errorf("cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

var sweepNodesOnce sync.Once

// sweepStaleNodes removes what nodes of test processes that are gone left:
// their pods' processes, their mounts and their namespaces (their
// directories go with the harness's sweep of stale directories).
func sweepStaleNodes() {
	sweepNodesOnce.Do(func() {
		matches, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*-node-*"))
		if os.TempDir() != "/tmp" {
			more, _ := filepath.Glob(filepath.Join("/tmp", tempPrefix+"*-node-*"))
			matches = append(matches, more...)
		}
		for _, m := range matches {
			rest := strings.TrimPrefix(filepath.Base(m), tempPrefix)
			pid, err := strconv.Atoi(rest[:max(strings.IndexByte(rest, '-'), 0)])
			if err != nil || pid == os.Getpid() {
				continue
			}
			if live, _ := procState(pid); live {
				continue
			}
			stale := &Cluster{Dir: m}
			stale.cgroupDirs, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", filepath.Base(m)))
			_ = stale.killCgroupTree()
			_ = killMatching(stale.ownedBy)
			_ = unmountUnder(m)
			_ = stale.removeCgroups()
			_ = os.RemoveAll(m)
		}
		socks, _ := filepath.Glob("/run/flashsale-node-*")
		for _, d := range socks {
			rest := strings.TrimPrefix(filepath.Base(d), "flashsale-node-")
			pid, err := strconv.Atoi(rest[:max(strings.IndexByte(rest, '-'), 0)])
			if err == nil && pid != os.Getpid() {
				if live, _ := procState(pid); !live {
					stale := &Cluster{sockDir: d}
					_ = killMatching(func(pid int) bool {
						cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
						return bytes.Contains(cmdline, []byte(stale.containerdSock()))
					})
					_ = os.RemoveAll(d)
				}
			}
		}
		sweepStaleNodeNets()
	})
}
