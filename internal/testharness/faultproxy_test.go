package testharness

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes every byte back and counts the bytes it received.
type echoServer struct {
	ln       net.Listener
	received atomic.Int64
	wg       sync.WaitGroup
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						e.received.Add(int64(n))
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return e
}

// roundTrip sends msg and reads it back within wait.
func roundTrip(c net.Conn, msg string, wait time.Duration) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func dialT(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}

func TestFaultProxyListensOnLoopbackAndPassesData(t *testing.T) {
	e := startEcho(t)
	f := FaultProxyT(t, e.ln.Addr().String())
	host, _, err := net.SplitHostPort(f.Addr())
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("proxy listens on %q (%v), want 127.0.0.1", f.Addr(), err)
	}
	if f.Upstream() != e.ln.Addr().String() {
		t.Fatalf("upstream %q", f.Upstream())
	}
	got, err := roundTrip(dialT(t, f.Addr()), "ping", 10*time.Second)
	if err != nil || got != "ping" {
		t.Fatalf("round trip: %q %v", got, err)
	}
	if len(f.Faults()) != 0 {
		t.Fatalf("faults in force: %v", f.Faults())
	}
}

// A downstream timeout lets the request reach the server and swallows the
// reply; removed, a new connection works again.
func TestFaultProxyTimeoutSwallowsReplies(t *testing.T) {
	e := startEcho(t)
	f := FaultProxyT(t, e.ln.Addr().String())
	name, err := f.Timeout(Downstream, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := dialT(t, f.Addr())
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, "the request to reach the server", func() bool { return e.received.Load() == 4 })
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); !isTimeout(err) {
		t.Fatalf("read through a swallowing proxy: %d bytes, %v; want a timeout", n, err)
	}
	if got := f.Faults(); len(got) != 1 || got[0] != name {
		t.Fatalf("faults in force: %v, want [%s]", got, name)
	}
	if err := f.Remove(name); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(name); err == nil {
		t.Fatal("removing a removed fault: no error")
	}
	got, err := roundTrip(dialT(t, f.Addr()), "back", 10*time.Second)
	if err != nil || got != "back" {
		t.Fatalf("round trip after removal: %q %v", got, err)
	}
}

// Latency holds a reply back; a client with a shorter read deadline sees a
// timeout, one that waits gets it.
func TestFaultProxyLatencyDelaysReplies(t *testing.T) {
	e := startEcho(t)
	f := FaultProxyT(t, e.ln.Addr().String())
	if _, err := f.Latency(Downstream, time.Hour); err != nil {
		t.Fatal(err)
	}
	c := dialT(t, f.Addr())
	if _, err := roundTrip(c, "slow", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("read under an hour of latency: %v; want a timeout", err)
	}
	Eventually(t, 30*time.Second, "the request to reach the server", func() bool { return e.received.Load() == 4 })
	f.RemoveAll()
	if len(f.Faults()) != 0 {
		t.Fatalf("faults after RemoveAll: %v", f.Faults())
	}
	if _, err := f.Latency(Downstream, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	got, err := roundTrip(dialT(t, f.Addr()), "late", 30*time.Second)
	if err != nil || got != "late" {
		t.Fatalf("round trip under 50ms of latency: %q %v", got, err)
	}
}

// ResetPeer downstream: the server gets the request, the client a reset.
func TestFaultProxyResetPeerLosesTheReply(t *testing.T) {
	e := startEcho(t)
	f := FaultProxyT(t, e.ln.Addr().String())
	if _, err := f.ResetPeer(Downstream, 0); err != nil {
		t.Fatal(err)
	}
	c := dialT(t, f.Addr())
	_, err := roundTrip(c, "gone", 30*time.Second)
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read through a resetting proxy: %v; want a reset", err)
	}
	if got := e.received.Load(); got != 4 {
		t.Fatalf("the server received %d bytes, want the 4 of the request", got)
	}
}

func TestFaultProxyRefusesBadFaults(t *testing.T) {
	e := startEcho(t)
	f := FaultProxyT(t, e.ln.Addr().String())
	if _, err := f.Latency("sideways", time.Second); err == nil {
		t.Error("a direction that is neither up nor down: no error")
	}
	if _, err := f.Timeout(Upstream, -time.Second); err == nil {
		t.Error("a negative timeout: no error")
	}
	for _, d := range []time.Duration{500 * time.Microsecond, 1500 * time.Microsecond, 0} {
		if _, err := f.Latency(Downstream, d); err == nil {
			t.Errorf("a latency of %v, which the proxy would not add as such: no error", d)
		}
	}
	for _, d := range []time.Duration{500 * time.Microsecond, 1500 * time.Microsecond} {
		if _, err := f.Timeout(Downstream, d); err == nil {
			t.Errorf("a timeout of %v, which the proxy would round down: no error", d)
		}
		if _, err := f.ResetPeer(Downstream, d); err == nil {
			t.Errorf("a reset after %v, which the proxy would round down: no error", d)
		}
	}
	if len(f.Faults()) != 0 {
		t.Fatalf("a refused fault is in force: %v", f.Faults())
	}
}

// Close ends the connections through the proxy and stops listening, even
// with a fault holding a connection silent.
func TestFaultProxyCloseEndsEverything(t *testing.T) {
	e := startEcho(t)
	f, err := StartFaultProxy(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := dialT(t, f.Addr())
	if got, err := roundTrip(c, "open", 10*time.Second); err != nil || got != "open" {
		t.Fatalf("round trip: %q %v", got, err)
	}
	if _, err := f.Timeout(Downstream, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("read on a connection of a closed proxy: %v; want it closed", err)
	}
	if c2, err := net.DialTimeout("tcp", f.Addr(), 5*time.Second); err == nil {
		c2.Close()
		t.Fatal("a closed proxy still accepts connections")
	}
	if _, err := f.Latency(Downstream, time.Second); err == nil {
		t.Fatal("a fault added to a closed proxy: no error")
	}
}
