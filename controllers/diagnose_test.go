package controllers_test

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// diagnosis is what a wait that timed out prints beside the status: the
// sale's events in order, and the stacks of the reconciles and rebuilds
// running in the process (every test's: a stack does not say whose). A wait
// that fails on a busy CI machine is then read from its output, not guessed
// at.
func diagnosis(ns, name string) string {
	var b strings.Builder
	var list corev1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		fmt.Fprintf(&b, "\nevents: %v", err)
	}
	sort.SliceStable(list.Items, func(i, j int) bool {
		return eventTime(&list.Items[i]).Before(eventTime(&list.Items[j]))
	})
	b.WriteString("\nevents of " + name + ":")
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == name {
			fmt.Fprintf(&b, "\n  %s %s x%d: %s", eventTime(&ev).Format("15:04:05.000"), ev.Reason, max(ev.Count, 1), ev.Message)
		}
	}
	b.WriteString("\nreconciles and rebuilds running:")
	for _, g := range goroutines() {
		if strings.Contains(g, "controllers.(*FlashSaleReconciler).Reconcile(") || strings.Contains(g, "controllers.(*FlashSaleReconciler).startRebuild.func") {
			b.WriteString("\n" + g)
		}
	}
	return b.String()
}

func eventTime(ev *corev1.Event) time.Time {
	switch {
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	case !ev.LastTimestamp.IsZero():
		return ev.LastTimestamp.Time
	}
	return ev.CreationTimestamp.Time
}

// goroutines is every goroutine's stack, one per element.
func goroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}
