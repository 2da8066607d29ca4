package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/log"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

// Every event the manager sends is in its log too, with its reason: events
// expire after an hour, the log is the incident's timeline after that.
func TestRecordedEventsAreLogged(t *testing.T) {
	var lines []string
	logger := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	rec := events.NewFakeRecorder(1)
	r := &FlashSaleReconciler{Recorder: rec}
	fs := &flashsalev1alpha1.FlashSale{}
	ctx := log.IntoContext(context.Background(), logger)

	r.recordEvent(ctx, fs, nil, corev1.EventTypeWarning, ReasonReplicasOverridden, "Scale", "hpa-x set Deployment d to 7 replicas")
	if got := <-rec.Events; !strings.Contains(got, ReasonReplicasOverridden) || !strings.Contains(got, "hpa-x set Deployment d to 7 replicas") {
		t.Fatalf("event %q", got)
	}
	if len(lines) != 1 || !strings.Contains(lines[0], `"reason"="ReplicasOverridden"`) || !strings.Contains(lines[0], "hpa-x set Deployment d to 7 replicas") {
		t.Fatalf("logged %q", lines)
	}
}

// Events go through recordEvent alone, so none of them misses the log.
func TestEventsGoThroughRecordEvent(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var sites []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "Recorder.Eventf(") || strings.Contains(line, "Recorder.AnnotatedEventf(") {
				sites = append(sites, fmt.Sprintf("%s:%d", f, i+1))
			}
		}
	}
	if len(sites) != 1 {
		t.Fatalf("the recorder is called at %v; only recordEvent should call it", sites)
	}
}
