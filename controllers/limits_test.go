package controllers

import (
	"strings"
	"testing"
	"unicode/utf8"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Event messages are cut to what the API server takes, on a character
// boundary; a longer one would be refused and the event lost.
func TestTruncate(t *testing.T) {
	for _, s := range []string{strings.Repeat("x", 5000), strings.Repeat("é", 700), strings.Repeat("→", 400), "short"} {
		got := truncate(s, eventNoteLimit)
		if len(got) > eventNoteLimit || !utf8.ValidString(got) {
			t.Errorf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
		}
		if len(s) <= eventNoteLimit && got != s {
			t.Errorf("a short message was cut: %q", got)
		}
		if len(s) > eventNoteLimit && (!strings.HasSuffix(got, "…") || len(got) < eventNoteLimit-3) {
			t.Errorf("cut to %d bytes: %q…", len(got), got[len(got)-10:])
		}
	}
}

// A sale whose reconciles keep failing is retried within maxFailureBackoff,
// so that its schedule's edges are late by no more than that.
func TestFailureBackoffIsBounded(t *testing.T) {
	rl := failureRateLimiter()
	var req reconcile.Request
	for range 40 {
		if d := rl.When(req); d > maxFailureBackoff {
			t.Fatalf("retry after %s", d)
		}
	}
	if d := rl.When(req); d != maxFailureBackoff {
		t.Fatalf("retry after %s once failures pile up, want %s", d, maxFailureBackoff)
	}
}
