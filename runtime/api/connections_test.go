package api

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// With MaxConnections held open, the next client's connection is not
// accepted, so its request is not read, until one of them closes; then it is
// answered. (The kernel completes the connection in the listen queue: the
// client sees no error, only no answer yet.)
func TestConnectionsPastTheBoundWaitToBeAccepted(t *testing.T) {
	f := newFixture(t, func(c *fixtureConfig) { c.api.MaxConnections = 2 })
	f.client.CloseIdleConnections() // the bound is this test's alone
	var held []*http.Transport
	for range 2 {
		tr := &http.Transport{MaxIdleConnsPerHost: 1}
		t.Cleanup(tr.CloseIdleConnections)
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(f.base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		// Read to the end, so that the connection is kept alive: idle, it
		// still holds its place.
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		held = append(held, tr)
	}

	conn, err := net.Dial("tcp", strings.TrimPrefix(f.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	answer := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if line, err := answer.ReadString('\n'); err == nil {
		t.Fatalf("a third connection past a bound of 2 was answered at once: %q", line)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("a third connection past a bound of 2: %v, want no answer yet", err)
	}

	held[0].CloseIdleConnections()
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if line, err := answer.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("once a connection closed, the third was answered %q, %v; want 200", line, err)
	}
}
