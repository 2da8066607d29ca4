package testharness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ErrNodeUnsupported wraps the reason a real node cannot run on this machine
// (a kernel feature it needs is absent). Tests skip on it, saying why; a
// missing binary or package is an error instead.
var ErrNodeUnsupported = errors.New("a real test node cannot run here")

// nodeStartTimeout bounds the node's coming up: the kubelet registering and
// turning Ready takes a while on a loaded machine.
const nodeStartTimeout = 3 * time.Minute

// NodeName is the name the kubelet registers.
const NodeName = "flashsale-node"

var nodeSeq atomic.Int32

// Cluster is a real one-node Kubernetes: etcd, kube-apiserver (envtest's,
// with the project's CRDs), kube-controller-manager, kube-scheduler,
// containerd, the kubelet and kube-proxy. All of them run in a network
// namespace of their own that holds the pod and Service networks; this
// machine reaches it only at NodeIP, through one veth pair.
type Cluster struct {
	Dir        string
	NodeIP     string // the node's address: the API server, the kubelet, forwarded ports
	Kube       *Kube
	Kubeconfig string // an admin kubeconfig (system:masters)
	KubectlBin string
	Netns      string // /run/netns/<name>

	net        *nodeNet
	sockDir    string // containerd's sockets: a unix socket path has at most 107 bytes
	cgroupRoot string
	cgroupDirs []string
	procs      []*namedProc
	fwd        []*forwarder
	stopOnce   sync.Once
	stopErr    error
}

type namedProc struct {
	name string
	*proc
}

// NodeBinaries finds the kubelet, kube-controller-manager, kube-scheduler
// and kube-proxy: $FLASHSALE_KUBE_NODE, or the cache hack/build-kube-node.sh
// fills (and prints).
func NodeBinaries() (string, error) {
	dir := os.Getenv("FLASHSALE_KUBE_NODE")
	if dir == "" {
		script := filepath.Join(RepoRoot(), "hack", "build-kube-node.sh")
		out, err := exec.Command("bash", script).Output()
		if err != nil {
			return "", fmt.Errorf("node binaries missing and %s failed: %w (run `make kube-node`)", script, err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		dir = lines[len(lines)-1]
	}
	for _, b := range []string{"kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s not found in %s: run `make kube-node`", b, dir)
		}
	}
	return dir, nil
}

// NodeSupported says whether this machine can run a real node: root, network
// namespaces, veth, overlayfs and the cgroup v1 memory controller. The error
// wraps ErrNodeUnsupported with what is absent.
func NodeSupported() error {
	unsupported := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrNodeUnsupported, fmt.Sprintf(format, a...))
	}
	if os.Geteuid() != 0 {
		return unsupported("the kubelet and containerd need root (running as uid %d)", os.Geteuid())
	}
	fsList, _ := os.ReadFile("/proc/filesystems")
	if !strings.Contains(string(fsList), "overlay") {
		return unsupported("the kernel has no overlay file system (/proc/filesystems)")
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err != nil {
		if _, err2 := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err2 != nil {
			return unsupported("no cgroup memory controller: %v", err)
		}
	}
	for _, c := range []struct{ bin, pkg string }{
		{"containerd", "containerd"}, {"runc", "runc"}, {"ctr", "containerd"}, {"ip", "iproute2"},
		{"iptables", "iptables"}, {"nsenter", "util-linux"}, {"conntrack", "conntrack"},
	} {
		if _, err := exec.LookPath(c.bin); err != nil {
			return missing(c.bin, c.pkg)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return missing("/usr/lib/cni/bridge", "containernetworking-plugins")
	}
	probe := fmt.Sprintf("flashsale-probe-%d", os.Getpid())
	if err := ipCmd("netns", "add", probe); err != nil {
		return unsupported("cannot make a network namespace: %v", err)
	}
	defer func() { _ = ipCmd("netns", "del", probe) }()
	if err := ipCmd("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"); err != nil {
		return unsupported("cannot make a veth pair: %v", err)
	}
	return nil
}

// NodeT starts a cluster for a test, skipping it (with the reason) when the
// machine cannot run a node, and stops it in t.Cleanup.
func NodeT(t testing.TB) *Cluster {
	t.Helper()
	if err := NodeSupported(); errors.Is(err, ErrNodeUnsupported) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	c, err := StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// StartCluster brings a node up and waits until it is Ready. On error,
// whatever started is stopped.
func StartCluster() (_ *Cluster, err error) {
	if err := NodeSupported(); err != nil {
		return nil, err
	}
	assets, err := KubeAssets()
	if err != nil {
		return nil, err
	}
	nodeBins, err := NodeBinaries()
	if err != nil {
		return nil, err
	}
	sweepStaleNodes()
	// The kubelet and containerd make unix sockets below it: a short path.
	base := os.TempDir()
	if len(base) > 24 {
		base = "/tmp"
	}
	sweepOnce.Do(sweepStale)
	dir, err := os.MkdirTemp(base, fmt.Sprintf("%s%d-node-", tempPrefix, os.Getpid()))
	if err != nil {
		return nil, err
	}
	// PostgreSQL's user and the pods' users read below here.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir}
	register(c)
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop())
		}
	}()
	seq := int(nodeSeq.Add(1))
	c.sockDir = fmt.Sprintf("/run/flashsale-node-%d-%d", os.Getpid(), seq)
	if err := os.Mkdir(c.sockDir, 0o700); err != nil {
		return nil, err
	}
	if c.net, err = newNodeNet(seq); err != nil {
		return nil, err
	}
	c.NodeIP, c.Netns = c.net.nodeIP, c.net.path()
	if err := c.startControlPlane(assets); err != nil {
		return nil, err
	}
	if err := c.startNode(nodeBins); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) containerdSock() string {
	return filepath.Join(c.sockDir, "containerd.sock")
}

// startControlPlane starts etcd and the API server (envtest, in the node's
// namespace on NodeIP), then the controller manager and the scheduler.
func (c *Cluster) startControlPlane(assets string) error {
	bin, certs := filepath.Join(c.Dir, "bin"), filepath.Join(c.Dir, "certs")
	for _, d := range []string{bin, certs, filepath.Join(c.Dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	wrap := func(b string) (string, error) {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			return "", missing("setpriv", "util-linux")
		}
		path := filepath.Join(bin, b)
		// Its output in logs/, beside the other components': envtest
		// discards it.
		script := fmt.Sprintf("#!/bin/sh\nexec nsenter --net=%s -- %s --pdeathsig KILL %s \"$@\" >>%s 2>&1\n",
			shellQuote(c.Netns), shellQuote(setpriv), shellQuote(filepath.Join(assets, b)),
			shellQuote(filepath.Join(c.Dir, "logs", b+".log")))
		return path, os.WriteFile(path, []byte(script), 0o755)
	}
	etcd, err := wrap("etcd")
	if err != nil {
		return err
	}
	apiserver, err := wrap("kube-apiserver")
	if err != nil {
		return err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	etcdURL := &url.URL{Scheme: "http", Host: net.JoinHostPort(c.NodeIP, "2379")}
	env.ControlPlane.Etcd = &envtest.Etcd{Path: etcd, DataDir: filepath.Join(c.Dir, "etcd"), URL: etcdURL}
	api := &envtest.APIServer{Path: apiserver, CertDir: certs}
	api.SecureServing.ListenAddr.Address = c.NodeIP
	api.SecureServing.ListenAddr.Port = "6443"
	args := api.Configure()
	args.Set("service-cluster-ip-range", serviceCIDR)
	args.Set("advertise-address", c.NodeIP)
	// The kubelet by its address: the node's name resolves nowhere.
	args.Set("kubelet-preferred-address-types", "InternalIP")
	// The ServiceAccount admission plugin mounts the pods' API tokens;
	// envtest turns it off because it runs no controller manager.
	args.Disable("disable-admission-plugins")
	env.ControlPlane.APIServer = api
	if _, err := env.Start(); err != nil {
		_ = env.Stop()
		return fmt.Errorf("starting etcd and the API server in %s: %w", c.Netns, err)
	}
	c.Kube = &Kube{Env: env, Config: env.Config}
	kc, err := c.Kube.Kubeconfig(c.Dir)
	if err != nil {
		return err
	}
	c.Kubeconfig = kc
	c.KubectlBin = filepath.Join(assets, "kubectl")
	if err := os.WriteFile(filepath.Join(certs, "ca.crt"), env.Config.CAData, 0o644); err != nil {
		return err
	}
	return nil
}

// startNode starts the controller manager, the scheduler, containerd, the
// kubelet and kube-proxy, and waits for the node to be Ready.
func (c *Cluster) startNode(bins string) error {
	cd := filepath.Join(c.Dir, "containerd")
	cniConf := filepath.Join(c.Dir, "cni", "net.d")
	kubeletDir := filepath.Join(c.Dir, "kubelet")
	c.cgroupRoot = "/" + filepath.Base(c.Dir)
	if err := writeFiles(map[string]string{
		filepath.Join(cd, "config.toml"):             containerdConfig(cd, c.sockDir, cniConf),
		filepath.Join(cniConf, "10-bridge.conflist"): cniConfig(filepath.Join(c.Dir, "cni", "ipam")),
	}); err != nil {
		return err
	}
	ctrls, err := cgroupV1Controllers()
	if err != nil {
		return err
	}
	for _, ctl := range ctrls {
		d := filepath.Join(ctl, c.cgroupRoot)
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("cgroup root for the kubelet: %w", err)
		}
		c.cgroupDirs = append(c.cgroupDirs, d)
		// A new cpuset starts empty: no process could join it.
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(ctl, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), v, 0); err != nil {
					return fmt.Errorf("cgroup %s: %w", filepath.Join(d, f), err)
				}
			}
		}
	}
	if err := writeFiles(map[string]string{filepath.Join(kubeletDir, "config.yaml"): kubeletConfig(c)}); err != nil {
		return err
	}
	certs := filepath.Join(c.Dir, "certs")
	if err := c.start("kube-controller-manager", filepath.Join(bins, "kube-controller-manager"),
		"--kubeconfig="+c.Kubeconfig, "--leader-elect=false", "--bind-address=127.0.0.1",
		"--root-ca-file="+filepath.Join(certs, "ca.crt"),
		"--service-account-private-key-file="+filepath.Join(certs, "sa-signer.key"),
		"--use-service-account-credentials=false", "--controllers=*",
		"--node-monitor-grace-period=20s", "--concurrent-deployment-syncs=10"); err != nil {
		return err
	}
	if err := c.start("kube-scheduler", filepath.Join(bins, "kube-scheduler"),
		"--kubeconfig="+c.Kubeconfig, "--leader-elect=false", "--bind-address=127.0.0.1"); err != nil {
		return err
	}
	if err := c.start("containerd", "containerd", "--config", filepath.Join(cd, "config.toml")); err != nil {
		return err
	}
	if err := c.waitFor("containerd", func() error {
		return exec.Command("ctr", "--address", c.containerdSock(), "version").Run()
	}); err != nil {
		return err
	}
	// The sandbox image is there before the kubelet asks for a pod.
	pause, err := pauseArchive()
	if err != nil {
		return err
	}
	if err := c.LoadImage(pause); err != nil {
		return err
	}
	if err := c.start("kubelet", filepath.Join(bins, "kubelet"),
		"--config="+filepath.Join(kubeletDir, "config.yaml"), "--kubeconfig="+c.Kubeconfig,
		"--root-dir="+kubeletDir, "--cert-dir="+filepath.Join(kubeletDir, "pki"),
		"--hostname-override="+NodeName, "--node-ip="+c.NodeIP); err != nil {
		return err
	}
	if err := c.start("kube-proxy", filepath.Join(bins, "kube-proxy"),
		"--kubeconfig="+c.Kubeconfig, "--hostname-override="+NodeName, "--proxy-mode=iptables",
		"--cluster-cidr="+podCIDR, "--oom-score-adj=0", "--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256"); err != nil {
		return err
	}
	return c.waitFor("node "+NodeName+" Ready", func() error {
		out, err := c.Kubectl(context.Background(), nil, "get", "node", NodeName, "-o",
			`jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "True" {
			return fmt.Errorf("Ready=%q", strings.TrimSpace(out))
		}
		out, err = c.Kubectl(context.Background(), nil, "get", "serviceaccount", "default", "-n", "default", "-o", "name")
		if err != nil || strings.TrimSpace(out) == "" {
			return fmt.Errorf("no default ServiceAccount yet: %v", err)
		}
		return nil
	})
}

// start runs a component in the node's namespace, its log in logs/<name>.log.
func (c *Cluster) start(name, bin string, args ...string) error {
	cmd, cargs := c.net.nsenterArgs(bin, args...)
	p, err := startProc(filepath.Join(c.Dir, "logs", name+".log"), c.Dir, nil, nil, cmd, cargs...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, &namedProc{name, p})
	return nil
}

// waitFor polls check until it passes, failing early when a component exited.
func (c *Cluster) waitFor(what string, check func() error) error {
	deadline := time.Now().Add(nodeStartTimeout)
	for {
		for _, p := range c.procs {
			if p.exited() {
				return fmt.Errorf("%s exited (%v) while waiting for %s\n%s", p.name, p.waitErr, what, logTail(p.logPath))
			}
		}
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %v: %w", what, nodeStartTimeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Kubectl runs kubectl with the admin kubeconfig and returns its stdout; the
// error carries stderr.
func (c *Cluster) Kubectl(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.KubectlBin, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = strings.NewReader(string(stdin))
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// Command prepares name with args to run in the node's namespace, where the
// Service network is (a storm through kube-proxy runs there).
func (c *Cluster) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	n, a := c.net.nsenterArgs(name, args...)
	cmd := exec.CommandContext(ctx, n, a...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// DialContext connects from inside the node's namespace, where the pod and
// Service addresses are.
func (c *Cluster) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialIn(ctx, c.Netns, network, addr)
}

// HTTPClient is an HTTP client whose connections start inside the node's
// namespace (requests to a Service's ClusterIP go through kube-proxy).
func (c *Cluster) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: c.DialContext, MaxIdleConnsPerHost: 64}}
}

// LoadImage imports an image archive (OCI or docker) into the node's
// containerd, where the kubelet finds it.
func (c *Cluster) LoadImage(archive string) error {
	out, err := exec.Command("ctr", "--address", c.containerdSock(), "-n", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %w: %s", archive, err, out)
	}
	return nil
}

// Expose makes a server on this machine's loopback (hostAddr, 127.0.0.1:PORT)
// reachable inside the node's namespace at NodeIP:PORT, for pods and for
// commands run with Command; it returns that address.
func (c *Cluster) Expose(hostAddr string) (string, error) {
	_, port, err := net.SplitHostPort(hostAddr)
	if err != nil {
		return "", err
	}
	f, err := newForwarder(c.Netns, net.JoinHostPort(c.NodeIP, port), hostAddr)
	if err != nil {
		return "", err
	}
	c.fwd = append(c.fwd, f)
	return f.addr(), nil
}

var pauseOnce struct {
	sync.Once
	path string
	err  error
}

// pauseArchive builds the pause image once per process.
func pauseArchive() (string, error) {
	pauseOnce.Do(func() {
		dir, err := TempDir("pause")
		if err != nil {
			pauseOnce.err = err
			return
		}
		bin := filepath.Join(dir, "pause")
		if err := BuildStatic("./internal/testharness/pause", bin, ""); err != nil {
			pauseOnce.err = err
			return
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			pauseOnce.err = err
			return
		}
		pauseOnce.path = filepath.Join(dir, "pause.oci.tar")
		pauseOnce.err = WriteImageArchive(PauseImageSpec(data), pauseOnce.path)
	})
	return pauseOnce.path, pauseOnce.err
}

// Close is Stop, for CloseAll.
func (c *Cluster) Close() error { return c.Stop() }
