package api

import (
	"testing"
	"time"
)

// One line per key a second, and the next one written counts those held back.
func TestLogSampler(t *testing.T) {
	var l logSampler
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	if ok, n := l.allow("reserve", t0); !ok || n != 0 {
		t.Fatalf("first line: %v %d", ok, n)
	}
	for i := range 500 {
		if ok, _ := l.allow("reserve", t0.Add(time.Duration(i)*time.Millisecond)); ok {
			t.Fatalf("line %d within the second let through", i)
		}
	}
	if ok, _ := l.allow("checkout", t0.Add(time.Millisecond)); !ok {
		t.Fatal("another key held back")
	}
	if ok, n := l.allow("reserve", t0.Add(time.Second)); !ok || n != 500 {
		t.Fatalf("a second later: %v, %d held back, want 500", ok, n)
	}
}
