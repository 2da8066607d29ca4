package testharness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The test node's addresses. The node lives in a network namespace of its
// own, joined to this machine's by one veth pair whose /30 is the only
// address space both sides see: nodeLinkNet.X.1 on this side, .2 (the node
// IP) inside. The pod and Service networks exist only inside the namespace
// (no route to them is added here, and the namespace has no default route),
// so each node can use the same ones.
const (
	nodeLinkNet = "10.250"
	podCIDR     = "10.244.0.0/24"
	serviceCIDR = "10.96.0.0/24"
	maxNodes    = 250
)

// nodeNet is a node's namespace and link.
type nodeNet struct {
	name   string // ip netns name; /run/netns/<name>
	host   string // this side's veth
	hostIP string
	nodeIP string
}

func (n *nodeNet) path() string { return "/run/netns/" + n.name }

// ipCmd runs ip(8) and returns an error with its output.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNodeNet makes the namespace and the link. The host side's name is the
// lock on its /30: creating it fails when another node holds that number.
func newNodeNet(seq int) (*nodeNet, error) {
	n := &nodeNet{name: fmt.Sprintf("flashsale-%d-%d", os.Getpid(), seq)}
	if err := ipCmd("netns", "add", n.name); err != nil {
		return nil, err
	}
	for x := 1; x <= maxNodes; x++ {
		host := fmt.Sprintf("fsnode%d", x)
		if err := ipCmd("link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", n.name); err != nil {
			continue
		}
		n.host = host
		n.hostIP = fmt.Sprintf("%s.%d.1", nodeLinkNet, x)
		n.nodeIP = fmt.Sprintf("%s.%d.2", nodeLinkNet, x)
		break
	}
	if n.host == "" {
		return nil, errors.Join(fmt.Errorf("no free node link among fsnode1..fsnode%d", maxNodes), n.remove())
	}
	steps := [][]string{
		{"addr", "add", n.hostIP + "/30", "dev", n.host},
		{"link", "set", n.host, "up"},
		{"-n", n.name, "addr", "add", n.nodeIP + "/30", "dev", "eth0"},
		{"-n", n.name, "link", "set", "eth0", "up"},
		{"-n", n.name, "link", "set", "lo", "up"},
		// Connections made on the node itself to a ClusterIP need a route
		// before kube-proxy's DNAT rewrites them; through lo, one that
		// matches no Service goes nowhere.
		{"-n", n.name, "route", "add", serviceCIDR, "dev", "lo"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return nil, errors.Join(err, n.remove())
		}
	}
	// Inside the namespace only: the bridge routes between pods and the node.
	if out, err := exec.Command("nsenter", "--net="+n.path(), "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		return nil, errors.Join(fmt.Errorf("ip_forward in %s: %v: %s", n.name, err, out), n.remove())
	}
	return n, nil
}

// remove deletes the namespace; the veth pair and every iptables rule and
// route made inside go with it.
func (n *nodeNet) remove() error {
	var errs []error
	if n.host != "" {
		if err := ipCmd("link", "del", n.host); err != nil && linkExists(n.host) {
			errs = append(errs, err)
		}
	}
	if _, err := os.Stat(n.path()); err == nil {
		if err := ipCmd("netns", "del", n.name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// sweepStaleNodeNets deletes namespaces (and their links) left by test
// processes that are gone.
func sweepStaleNodeNets() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "flashsale-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(rest[:max(strings.IndexByte(rest, '-'), 0)])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if live, _ := procState(pid); !live {
			_ = ipCmd("netns", "del", e.Name())
		}
	}
}

// nsenterArgs prefixes a command so that it runs in the node's namespace
// (nsenter execs it: the PID is the command's).
func (n *nodeNet) nsenterArgs(name string, args ...string) (string, []string) {
	return "nsenter", append([]string{"--net=" + n.path(), "--", name}, args...)
}

// inNetns runs f on a thread that joined the namespace, then puts the thread
// back in this process's namespace. The thread must not die in between: a
// child process started from it earlier (the harness starts its servers with
// a parent-death signal, which is per thread) would be killed with it.
func inNetns(nsPath string, f func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", nsPath, err)
			return
		}
		f()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Stays locked: the thread ends with the goroutine rather than
			// run other goroutines in the node's namespace.
			errc <- nil
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	return <-errc
}

// listenIn opens a TCP listener inside the namespace: the socket stays there.
func listenIn(nsPath, addr string) (net.Listener, error) {
	var l net.Listener
	var lerr error
	if err := inNetns(nsPath, func() { l, lerr = net.Listen("tcp", addr) }); err != nil {
		return nil, err
	}
	return l, lerr
}

// forwarder accepts connections inside the node's namespace and relays each
// to an address on this machine's loopback: how pods reach the Redis and
// PostgreSQL servers the harness runs on 127.0.0.1.
type forwarder struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
	closed bool
}

func newForwarder(nsPath, listen, target string) (*forwarder, error) {
	if host, _, err := net.SplitHostPort(target); err != nil || !net.ParseIP(host).IsLoopback() {
		return nil, fmt.Errorf("forward target %q: only loopback addresses are forwarded to", target)
	}
	l, err := listenIn(nsPath, listen)
	if err != nil {
		return nil, err
	}
	f := &forwarder{l: l, target: target, conns: map[net.Conn]bool{}}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

func (f *forwarder) addr() string { return f.l.Addr().String() }

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.relay(c)
		}()
	}
}

func (f *forwarder) track(c net.Conn, on bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on && f.closed {
		return false
	}
	if on {
		f.conns[c] = true
	} else {
		delete(f.conns, c)
	}
	return true
}

func (f *forwarder) relay(in net.Conn) {
	defer in.Close()
	out, err := net.Dial("tcp", f.target)
	if err != nil {
		return // the server is down: the client sees the connection close
	}
	defer out.Close()
	if !f.track(in, true) || !f.track(out, true) {
		return
	}
	defer f.track(in, false)
	defer f.track(out, false)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}

func (f *forwarder) close() error {
	err := f.l.Close()
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	return err
}

// dialIn connects from inside the namespace (as listenIn does): the socket
// belongs to the namespace, so its Service and pod addresses are reachable.
// Only the socket's creation needs the namespace; the connect that follows
// happens there whatever thread waits for it.
func dialIn(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	var c net.Conn
	var derr error
	if err := inNetns(nsPath, func() {
		var d net.Dialer
		c, derr = d.DialContext(ctx, network, addr)
	}); err != nil {
		return nil, err
	}
	return c, derr
}
