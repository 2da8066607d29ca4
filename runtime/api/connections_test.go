package api

import (
	"bufio"
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
	f := newFixture(t, func(c *fixtureConfig) { c.api.MaxConnections = 2 })
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

	// One connection of two: kept alive.
	first, firstR := dial()
	if resp, err := get(first, firstR, 10*time.Second); err != nil || resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("below the bound: %+v, %v; want 200 on a kept-alive connection", resp, err)
	}
	// A second, accepted, that sends nothing yet: the bound is reached.
	second, secondR := dial()
	third, thirdR := dial()
	if resp, err := get(third, thirdR, 500*time.Millisecond); err == nil {
		t.Fatalf("a third connection past a bound of 2 was answered at once: %d", resp.StatusCode)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("a third connection past a bound of 2: %v, want no answer yet", err)
	}

	// At the bound the kept-alive connection's next answer closes it, which
	// lets the third in.
	if resp, err := get(first, firstR, 10*time.Second); err != nil || resp.StatusCode != http.StatusOK || !resp.Close {
		t.Fatalf("at the bound: %+v, %v; want 200 with Connection: close", resp, err)
	}
	_ = third.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(thirdR, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("once a connection closed, the third was answered %+v, %v; want 200", resp, err)
	}
	resp.Body.Close()
	if !resp.Close {
		t.Fatal("the third connection, answered at the bound, is kept alive")
	}
	if resp, err := get(second, secondR, 10*time.Second); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the second connection: %+v, %v", resp, err)
	}
}
