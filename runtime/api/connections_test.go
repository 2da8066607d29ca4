package api

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// With MaxConnections open, the next client's connection is not accepted, so
// its request is not read, until one of them closes; then it is answered.
// (The kernel completes the connection in the listen queue: the client sees
// no error, only no answer yet.) Below the bound a kept-alive connection
// stays open; at it, each answer closes its connection, so that the buyers
// waiting to be accepted are taken in turn.
func TestConnectionsPastTheBoundWaitToBeAccepted(t *testing.T) {
	const grace = 2 * time.Second
	f := newFixture(t, func(c *fixtureConfig) {
		c.api.MaxConnections, c.api.idleGrace = 2, grace
		c.api.ReadHeaderTimeout = 2 * time.Minute // silent connections hold their places
	})
	// The bound is this test's alone: the fixture's own connections close,
	// and the server sees them closed.
	f.client.CloseIdleConnections()
	open := func() int {
		if bl := f.srv.conns.Load(); bl != nil {
			return int(bl.open.Load())
		}
		return -1 // not serving yet
	}
	for deadline := time.Now().Add(10 * time.Second); open() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after the client closed its own", open())
		}
	}
	addr := strings.TrimPrefix(f.base, "http://")
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	get := func(c net.Conn, r *bufio.Reader, wait time.Duration) (*http.Response, error) {
		t.Helper()
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		resp, err := http.ReadResponse(r, nil)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}

	silent := func() net.Conn { c, _ := dial(); return c } // accepted, sends nothing: holds its place

	// One connection of two: answered and kept alive, then idle.
	a, aR := dial()
	if resp, err := get(a, aR, 10*time.Second); err != nil || resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("below the bound: %+v, %v; want 200 on a kept-alive connection", resp, err)
	}
	// A second fills the bound: the listener, with no place for a next one,
	// sweeps at once, and again a grace later; only then has the idle
	// connection been idle that long, and it is closed.
	b := silent()
	_ = a.SetReadDeadline(time.Now().Add(grace / 4))
	if _, err := aR.ReadByte(); err == nil {
		t.Fatal("the idle connection got data")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("a connection idle for less than the grace was closed: %v", err)
	}
	_ = a.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := aR.ReadByte(); err == nil {
		t.Fatal("the idle connection got data, want it closed")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the idle connection is still open with the bound reached")
	}
	// Two silent connections hold both places: a request on a third is not
	// read until one closes.
	c := silent()
	d, dR := dial()
	if resp, err := get(d, dR, 500*time.Millisecond); err == nil {
		t.Fatalf("a connection past a bound of 2 was answered at once: %d", resp.StatusCode)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("a connection past a bound of 2: %v, want no answer yet", err)
	}
	b.Close()
	_ = d.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(dR, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("once a connection closed, the waiting one was answered %+v, %v; want 200", resp, err)
	}
	resp.Body.Close()
	// Answered at the bound, so closed: the next buyer is taken in turn.
	if !resp.Close {
		t.Fatal("a connection answered at the bound is kept alive")
	}
	c.Close()
}

// An Accept waiting for a place returns once the listener closes (Shutdown
// closes it), and a connection gives its place back once, however often it
// is closed.
func TestBoundedListenerCloseWakesAWaitingAccept(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newBoundedListener(inner, 1)
	client, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	held, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if c != nil {
			c.Close()
		}
		accepted <- err
	}()
	select {
	case err := <-accepted:
		t.Fatalf("Accept past a bound of 1 returned %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-accepted:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("the waiting Accept returned %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting Accept did not return once the listener closed")
	}
	held.Close()
	held.Close()
	if n := l.open.Load(); n != 0 || len(l.places) != 0 {
		t.Fatalf("after closing the one connection twice: %d open, %d places taken", n, len(l.places))
	}
}
