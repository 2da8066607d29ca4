package sweeper

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestServeProbesAndMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg).setLeader(true)
	readyErr := errors.New("redis: connection refused")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ln, Handler(reg, func() error { return nil }, ReadyOnce(func(context.Context) error { return readyErr })))
	}()
	base := "http://" + ln.Addr().String()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "connection refused") {
		t.Fatalf("/readyz %d %q", code, body)
	}
	readyErr = nil // no request is in flight: no race
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d once ready", code)
	}
	// Ready once, ready through an outage of the shared servers.
	readyErr = errors.New("redis: connection refused")
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d in an outage after being ready", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "flashsale_sweeper_leader 1") {
		t.Fatalf("/metrics %d:\n%s", code, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
}

func TestHealthzFailsWhileTheLoopIsStuck(t *testing.T) {
	stuck := errors.New("a sweep has run for 51s: the loop is stuck")
	var live error
	h := Handler(prometheus.NewRegistry(), func() error { return live }, func(context.Context) error { return nil })
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, _ := get(); code != 200 {
		t.Fatalf("/healthz %d while live", code)
	}
	live = stuck
	if code, body := get(); code != 503 || !strings.Contains(body, "stuck") {
		t.Fatalf("/healthz %d %q while stuck", code, body)
	}
}
