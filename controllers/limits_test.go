package controllers

import (
	"strings"
	"testing"
	"unicode/utf8"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// A rollout is pods of an older template still running, or a template
// change not yet seen by the Deployment controller; a scale is none.
func TestRollingOut(t *testing.T) {
	d := func(gen, observed int64, spec, replicas, updated int32) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Generation: gen},
			Spec:       appsv1.DeploymentSpec{Replicas: &spec},
			Status:     appsv1.DeploymentStatus{ObservedGeneration: observed, Replicas: replicas, UpdatedReplicas: updated},
		}
	}
	for _, tc := range []struct {
		name string
		d    *appsv1.Deployment
		want bool
	}{
		{"rolled out", d(2, 2, 3, 3, 3), false},
		{"old pods running", d(2, 2, 3, 4, 2), true},
		{"template change not seen yet", d(3, 2, 3, 3, 3), true},
		{"scale not seen yet", d(3, 2, 5, 3, 3), false},
		{"scale during a rollout", d(3, 2, 5, 4, 2), true},
	} {
		if got := rollingOut(tc.d); got != tc.want {
			t.Errorf("%s: rollingOut %v, want %v", tc.name, got, tc.want)
		}
	}
}
