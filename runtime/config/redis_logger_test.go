package config

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// TestRedisLogsAreRoutedAndLimited: with Redis down, go-redis's own lines
// (dial failures) reach the sink RouteRedisLogs names, not standard error;
// the logger passes a burst at most, as structured JSON warnings, and the
// next line counts those dropped.
func TestRedisLogsAreRoutedAndLimited(t *testing.T) {
	var buf syncWriter
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	// A port nothing listens on: every dial fails and go-redis logs it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	// go-redis's own lines reach the sink RouteRedisLogs names.
	var routed syncWriter
	RouteRedisLogs(func(msg string, _ int) { routed.WriteString(msg + "\n") })
	t.Cleanup(func() { RouteRedisLogs(func(string, int) {}) })
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, PoolSize: 4, MinIdleConns: 2})
	_ = c.Ping(context.Background()).Err()
	testharness.Eventually(t, 30*time.Second, "go-redis's dial failure to reach the sink", func() bool {
		return strings.Contains(routed.String(), "failed to dial")
	})
	c.Close()

	// A burst at most, as structured warnings.
	l := newRedisLogger(SlogRedisSink(log), time.Hour, 3)
	for range 20 {
		l.Printf(context.Background(), "redis: %s:%d: dial failed %d", "pool.go", 770, 1)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines logged, want the burst of 3:\n%s", len(lines), buf.String())
	}
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["level"] != "WARN" || rec["msg"] != "redis client" {
			t.Fatalf("not a structured warning: %s (%v)", line, err)
		}
	}

	// After the interval the next line says how many were dropped.
	l2 := newRedisLogger(func(msg string, dropped int) {
		if dropped != 0 {
			buf.WriteString("dropped=" + msg + "\n")
		}
	}, time.Hour, 1)
	for range 5 {
		l2.Printf(context.Background(), "x")
	}
	l2.limit.SetLimit(rate.Inf) // the interval has passed, as far as the limiter knows
	l2.Printf(context.Background(), "y")
	if !strings.Contains(buf.String(), "dropped=y") {
		t.Fatalf("the line after the drops does not count them:\n%s", buf.String())
	}
}

// syncWriter is a buffer go-redis's goroutines and the test share.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) WriteString(s string) { _, _ = w.Write([]byte(s)) }

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
