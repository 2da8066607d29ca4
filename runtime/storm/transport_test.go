package storm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer answers the request body back and counts new connections.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s %s", r.Method, r.Header.Get("Authorization"), b)
		}
	}
	ts := httptest.NewUnstartedServer(h)
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	ts.Start()
	t.Cleanup(ts.Close)
	return ts, &conns
}

func doString(t *testing.T, c *http.Client, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer x")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestTransportReusesConnections(t *testing.T) {
	ts, conns := countingServer(t, nil)
	c := NewClient(16, 5*time.Second)
	for i := range 100 {
		if code, got := doString(t, c, http.MethodPost, ts.URL+"/x", fmt.Sprint(i)); code != 200 || got != fmt.Sprintf("POST Bearer x %d", i) {
			t.Fatalf("answer %d: %d %q", i, code, got)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("100 sequential requests used %d connections, want 1", n)
	}

	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 50 {
				body := fmt.Sprintf("%d-%d", g, i)
				req, _ := http.NewRequest(http.MethodPost, ts.URL, strings.NewReader(body))
				resp, err := c.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != "POST  "+body {
					t.Errorf("answer %q to %q: answers crossed", b, body)
				}
			}
		})
	}
	wg.Wait()
	if n := conns.Load(); n > 17 {
		t.Errorf("16 workers used %d connections, want at most 16 more than the first", n)
	}
}

func TestTransportChunkedAndEmptyAnswers(t *testing.T) {
	ts, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/chunked":
			for i := range 3 {
				fmt.Fprintf(w, "part%d;", i)
				w.(http.Flusher).Flush()
			}
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		}
	})
	c := NewClient(4, 5*time.Second)
	for range 3 {
		if _, got := doString(t, c, http.MethodGet, ts.URL+"/chunked", ""); got != "part0;part1;part2;" {
			t.Fatalf("chunked answer %q", got)
		}
		// Closed without reading: an empty answer leaves the connection reusable.
		resp, err := c.Get(ts.URL + "/empty")
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("empty answer: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("used %d connections, want 1", n)
	}
}

func TestTransportHonoursConnectionClose(t *testing.T) {
	ts, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		fmt.Fprint(w, "bye")
	})
	c := NewClient(4, 5*time.Second)
	for range 3 {
		if _, got := doString(t, c, http.MethodGet, ts.URL, ""); got != "bye" {
			t.Fatalf("answer %q", got)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("used %d connections, want 3 (one per Connection: close answer)", n)
	}
}

// A server that closes every connection after one answer without saying so,
// as a server closing an idle keep-alive connection does. The next request on
// that connection gets nothing back: a GET goes again on a new connection; a
// POST is the caller's to retry (the server might have acted on it).
func TestTransportResendsOnlyReplayableRequests(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var handled atomic.Int64
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				req, err := http.ReadRequest(bufio.NewReader(nc))
				if err != nil {
					return
				}
				b, _ := io.ReadAll(req.Body)
				handled.Add(1)
				fmt.Fprintf(nc, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
			}()
		}
	}()
	c := NewClient(4, 5*time.Second)
	url := "http://" + ln.Addr().String() + "/"
	for i := range 5 {
		if code, _ := doString(t, c, http.MethodGet, url, ""); code != 200 {
			t.Fatalf("GET %d: %d", i, code)
		}
		time.Sleep(20 * time.Millisecond) // let the server's close arrive
	}
	if n := handled.Load(); n != 5 {
		t.Errorf("server handled %d GETs, want 5 (each once)", n)
	}

	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("pay"))
	if _, err := c.Do(req); err == nil {
		t.Fatal("POST on a connection the server had closed answered")
	}
	if n := handled.Load(); n != 5 {
		t.Errorf("server handled %d requests, want the 5 GETs only", n)
	}
	req, _ = http.NewRequest(http.MethodPost, url, strings.NewReader("pay"))
	req.Header.Set("Idempotency-Key", "k1")
	time.Sleep(20 * time.Millisecond)
	if _, got := doString(t, c, http.MethodGet, url, ""); got != "" { // leaves a closed idle connection behind
		t.Fatalf("GET answer %q", got)
	}
	time.Sleep(20 * time.Millisecond)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST with an Idempotency-Key: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "pay" {
		t.Errorf("resent POST answer %q, want its body back", b)
	}
}

func TestTransportTimeoutAndCancel(t *testing.T) {
	release := make(chan struct{})
	ts, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		fmt.Fprint(w, "ok")
	})
	defer close(release)
	c := NewClient(4, 200*time.Millisecond)
	start := time.Now()
	_, err := c.Get(ts.URL + "/slow")
	var ne net.Error
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("slow answer: %v, want a timeout", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("timeout after %v", d)
	}
	if _, got := doString(t, c, http.MethodGet, ts.URL+"/fast", ""); got != "ok" {
		t.Errorf("after a timeout: %q", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/slow", nil)
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	start = time.Now()
	if _, err := (&http.Client{Transport: c.Transport}).Do(req); err == nil {
		t.Fatal("cancelled request answered")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("cancel took %v", d)
	}
	if _, got := doString(t, c, http.MethodGet, ts.URL+"/fast", ""); got != "ok" {
		t.Errorf("after a cancel: %q", got)
	}
}

func TestTransportRefusedAndHTTPS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := NewClient(4, time.Second)
	if _, err := c.Get("http://" + addr + "/"); err == nil {
		t.Error("request to a closed port answered")
	}

	tls := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "tls") }))
	defer tls.Close()
	c = &http.Client{Transport: &Transport{Fallback: tls.Client().Transport}, Timeout: 5 * time.Second}
	if _, got := doString(t, c, http.MethodGet, tls.URL, ""); got != "tls" {
		t.Errorf("https answer %q", got)
	}
}

// Retried reads the report's labels as answer.retryable reads answers.
func TestRetriedAgreesWithRetryable(t *testing.T) {
	for _, status := range []int{200, 201, 307, 400, 401, 404, 409, 410, 425, 429, 500, 502, 503} {
		for _, code := range []string{"", "SOLD_OUT", "UNAVAILABLE", "RATE_LIMITED"} {
			label := outcomeLabel(status, code)
			if got, want := Retried(label), (answer{status: status}).retryable(); got != want {
				t.Errorf("Retried(%q) = %v, retryable %v", label, got, want)
			}
		}
	}
	for _, label := range []string{transportLabel(errors.New("dial tcp: connection refused")), "ERR request", "ERR body"} {
		if !Retried(label) {
			t.Errorf("Retried(%q) = false for a transport error", label)
		}
	}
}
