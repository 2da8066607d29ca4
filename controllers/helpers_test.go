package controllers_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

const settle = 20 * time.Second

// markReady plays the kubelet's part for a Deployment: every replica ready.
func markReady(t *testing.T, ns, deployment string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(settle)
	for {
		var d appsv1.Deployment
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: deployment}, &d)
		if err == nil {
			n := *d.Spec.Replicas
			d.Status.Replicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas, d.Status.UpdatedReplicas = n, n, n, n
			d.Status.ObservedGeneration = d.Generation
			if err = k8s.Status().Update(ctx, &d); err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("reserve deployment: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kubectl runs the real kubectl (the one built with the envtest binaries, or PATH's).
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	assets, err := testharness.KubeAssets()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(assets, "kubectl")
	cfg, err := kube.Kubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, append([]string{"--kubeconfig", cfg}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func hasEvent(t *testing.T, ns, name, reason string) bool {
	t.Helper()
	return hasEventSaying(t, ns, name, reason, "")
}

// hasEventSaying waits up to settle for an event of name with reason whose
// message contains text.
func hasEventSaying(t *testing.T, ns, name, reason, text string) bool {
	t.Helper()
	deadline := time.Now().Add(settle)
	for time.Now().Before(deadline) {
		var list corev1.EventList
		if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, ev := range list.Items {
			if ev.InvolvedObject.Name == name && ev.Reason == reason && strings.Contains(ev.Message, text) {
				return true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func updateSpec(t *testing.T, ns, name string, mutate func(*flashsalev1alpha1.FlashSale)) {
	t.Helper()
	for range 10 {
		fs := &flashsalev1alpha1.FlashSale{}
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, fs); err != nil {
			t.Fatal(err)
		}
		mutate(fs)
		err := k8s.Update(context.Background(), fs)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
	t.Fatal("could not update the spec")
}

// countEvents counts the Events of one reason about one object.
func countEvents(t *testing.T, ns, name, reason string) int {
	t.Helper()
	return len(eventsAbout(t, ns, name, reason))
}

// countSent counts the times events of reason about name were sent,
// repeats the recorder folded into one series included.
func countSent(t *testing.T, ns, name, reason string) int {
	t.Helper()
	n := 0
	for _, ev := range eventsAbout(t, ns, name, reason) {
		c := max(1, int(ev.Count))
		if ev.Series != nil {
			c = max(c, int(ev.Series.Count))
		}
		n += c
	}
	return n
}

// eventsAbout lists the events of reason about the object name in ns.
func eventsAbout(t *testing.T, ns, name, reason string) []corev1.Event {
	t.Helper()
	var list corev1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == name && ev.Reason == reason {
			out = append(out, ev)
		}
	}
	return out
}

// noSecretIn fails the test if secret shows in the FlashSale's conditions or
// in an event about it.
func noSecretIn(t *testing.T, ns string, fs *flashsalev1alpha1.FlashSale, secret string) {
	t.Helper()
	for _, c := range fs.Status.Conditions {
		if strings.Contains(c.Message, secret) {
			t.Errorf("condition %s shows the password: %s", c.Type, c.Message)
		}
	}
	var events corev1.EventList
	if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		if strings.Contains(ev.Message, secret) {
			t.Errorf("event %s shows the password: %s", ev.Reason, ev.Message)
		}
	}
}

// reconcileTimeouts is controller-runtime's count of the FlashSale
// controller's reconciles that reached their deadline.
func reconcileTimeouts(t *testing.T) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_timeouts_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "flashsale" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// holdRebuild holds the rebuilds of sale name before each shard from the
// first'th on is finished (its failpoint; set it before startController).
// held is closed when one is first held; let lets them go, at most once:
// register it with t.Cleanup after startController, so that it runs before
// the manager stops, which waits for its rebuilds.
func (e *env) holdRebuild(name string, first int) (held <-chan struct{}, let func()) {
	h, release := make(chan struct{}), make(chan struct{})
	var holdOnce, releaseOnce sync.Once
	e.rebuildFailpoint = func(_, sale string, shard int) {
		if sale == name && shard >= first {
			holdOnce.Do(func() { close(h) })
			<-release
		}
	}
	return h, func() { releaseOnce.Do(func() { close(release) }) }
}
