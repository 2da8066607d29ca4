package controllers_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
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

func TestCreateSeedsDeploysAndReports(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.apply(e.sale("ps5-drop", 100))
	fs := e.waitFor("ps5-drop", settle, "Seeded", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue)
	})
	if fs.Status.Epoch != 1 || len(fs.Status.Shards) != 4 {
		t.Fatalf("status %+v", fs.Status)
	}
	ctx := context.Background()
	for _, name := range []string{"ps5-drop-reserve", "ps5-drop-sweeper"} {
		var d appsv1.Deployment
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: name}, &d); err != nil {
			t.Fatal(err)
		}
		if !metav1.IsControlledBy(&d, fs) {
			t.Fatalf("%s is not owned by the FlashSale", name)
		}
		c := d.Spec.Template.Spec.Containers[0]
		if c.Image != "flashsale-operator:test" || c.SecurityContext == nil || !*c.SecurityContext.RunAsNonRoot || c.ReadinessProbe == nil {
			t.Fatalf("%s container %+v", name, c)
		}
	}
	var svc corev1.Service
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "ps5-drop-reserve"}, &svc); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ps5-drop-reserve", "ps5-drop-sweeper"} {
		var pdb policyv1.PodDisruptionBudget
		testharness.Eventually(t, settle, "PodDisruptionBudget "+name, func() bool {
			return k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: name}, &pdb) == nil
		})
		if !metav1.IsControlledBy(&pdb, fs) || pdb.Spec.MaxUnavailable.IntValue() != 1 {
			t.Fatalf("PodDisruptionBudget %s: owners %v, spec %+v", name, pdb.OwnerReferences, pdb.Spec)
		}
	}
	// Every count is in status from the start, zeros included (printer columns).
	raw := kubectl(t, "get", "fs", "ps5-drop", "-n", e.ns, "-o", "jsonpath={.status.reserved},{.status.sold},{.status.available}")
	if raw != "0,0,100" {
		t.Fatalf("status counts as stored: %q", raw)
	}
	// Not Ready until the reservation API has a ready replica.
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("Ready before the API runs: %+v", c)
	}
	markReady(t, e.ns, "ps5-drop-reserve")
	// Nor until a sweeper is.
	fs = e.waitFor("ps5-drop", settle, "SweeperNotReady", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonSweeperNotReady))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); !strings.Contains(c.Message, "ps5-drop-sweeper has 0 of 2") {
		t.Fatalf("Ready without a sweeper: %+v", c)
	}
	markReady(t, e.ns, "ps5-drop-sweeper")
	e.waitFor("ps5-drop", settle, "Ready", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue)
	})
	// A change the pods enforce is Ready once they run it, not before.
	updateSpec(t, e.ns, "ps5-drop", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.MaxPerUser = ptr.To[int32](2) })
	fs = e.waitFor("ps5-drop", settle, "RollingOut", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonRollingOut))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c.ObservedGeneration != fs.Generation || !strings.Contains(c.Message, "ps5-drop-reserve is rolling out") {
		t.Fatalf("Ready during the rollout: %+v (generation %d)", c, fs.Generation)
	}
	markReady(t, e.ns, "ps5-drop-reserve")
	markReady(t, e.ns, "ps5-drop-sweeper")
	e.waitFor("ps5-drop", settle, "Ready after the rollout", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue)
	})

	// Status counts follow reservations made through the engine.
	eng := e.engineFor(fs, sharedRedis.Addr())
	var ids []string
	for i := range 7 {
		ids = append(ids, e.reserve(eng, fmt.Sprintf("buyer-%d", i)).ID)
	}
	for i, id := range ids[:3] {
		if co, err := eng.Checkout(ctx, fmt.Sprintf("buyer-%d", i), id, "pay"); err != nil || co.Outcome != ledger.CheckoutCommitted {
			t.Fatalf("checkout %v %v", co.Outcome, err)
		}
	}
	fs = e.waitFor("ps5-drop", settle, "counts", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Available == 93 && fs.Status.Reserved == 4 && fs.Status.Sold == 3
	})
	var shardSum int64
	for _, s := range fs.Status.Shards {
		shardSum += s.Available
	}
	if shardSum != 93 || fs.Status.Phase != flashsalev1alpha1.PhaseOpen || fs.Status.Allocation != 100 {
		t.Fatalf("status %+v", fs.Status)
	}
	if fs.Status.ObservedGeneration != fs.Generation {
		t.Fatalf("observedGeneration %d, generation %d", fs.Status.ObservedGeneration, fs.Generation)
	}

	// kubectl get fs shows the columns filled in.
	out := kubectl(t, "get", "fs", "-n", e.ns)
	for _, want := range []string{"SKU", "PHASE", "ADMITTING", "AVAILABLE", "itm-ps5-drop", "Open", "True", "100", "93", "4", "3"} {
		if !strings.Contains(out, want) {
			t.Fatalf("kubectl get fs output lacks %q:\n%s", want, out)
		}
	}
	// kubectl wait works on the Ready condition.
	kubectl(t, "wait", "--for=condition=Ready", "--timeout=10s", "-n", e.ns, "flashsale/ps5-drop")
	if fs.Generation != 2 { // the maxPerUser change above
		t.Fatalf("the controller changed the spec: generation %d", fs.Generation)
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

func TestScheduleGatesAndLifecycle(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	// An hour ahead at first, so a slow first reconcile still sees a
	// scheduled sale; then moved to a few seconds from now, as a pipeline
	// that brings a drop forward does.
	e.apply(e.sale("scheduled", 50).schedule(time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)))
	fs := e.waitFor("scheduled", settle, "Scheduled", phaseIs(flashsalev1alpha1.PhaseScheduled))
	// Children exist ahead of the start, so pods are warm before the drop.
	var d appsv1.Deployment
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "scheduled-reserve"}, &d); err != nil {
		t.Fatalf("reserve Deployment before the start: %v", err)
	}
	eng := e.engineFor(fs, sharedRedis.Addr())
	r, err := eng.Reserve(context.Background(), "early", "r", 1)
	if err != nil || r.Outcome != "CLOSED" || r.Reason != stock.StateNotStarted {
		t.Fatalf("before start: %+v %v", r, err)
	}
	start := time.Now().Add(4 * time.Second).Truncate(time.Second) // as the API stores it
	end := start.Add(5 * time.Second)
	updateSpec(t, e.ns, "scheduled", func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Schedule.Start, fs.Spec.Schedule.End = &metav1.Time{Time: start}, &metav1.Time{Time: end}
	})
	if r, err := eng.Reserve(context.Background(), "early", "r2", 1); err != nil || r.Outcome != "CLOSED" || r.Reason != stock.StateNotStarted {
		t.Fatalf("before the start brought forward: %+v %v", r, err)
	}
	fs = e.waitFor("scheduled", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	if late := time.Since(start); late > 2*time.Second {
		t.Fatalf("opened %s after the start", late)
	}
	res := e.reserve(eng, "on-time")
	e.waitFor("scheduled", settle, "Ended", phaseIs(flashsalev1alpha1.PhaseEnded))
	if r, _ := eng.Reserve(context.Background(), "too-late", "r", 1); r.Reason != stock.StateEnded {
		t.Fatalf("after end: %+v", r)
	}
	// Completed once nothing is pending.
	if c, err := eng.Cancel(context.Background(), "on-time", res.ID); err != nil || c.Outcome != ledger.CancelCancelled {
		t.Fatalf("cancel: %v %v", c.Outcome, err)
	}
	fs = e.waitFor("scheduled", settle, "Completed", phaseIs(flashsalev1alpha1.PhaseCompleted))
	if fs.Generation != 2 {
		t.Fatalf("the controller changed the spec: generation %d after one update", fs.Generation)
	}
	if !hasEvent(t, e.ns, "scheduled", controllers.ReasonPhaseChanged) {
		t.Fatal("no PhaseChanged event")
	}
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

func TestPauseRestockAndDecrease(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	fs := e.openSale("restock", 100)
	eng := e.engineFor(fs, sharedRedis.Addr())
	for i := range 5 {
		res := e.reserve(eng, fmt.Sprintf("u-%d", i))
		if _, err := eng.Checkout(context.Background(), fmt.Sprintf("u-%d", i), res.ID, "pay"); err != nil {
			t.Fatal(err)
		}
	}

	updateSpec(t, e.ns, "restock", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	e.waitFor("restock", settle, "Paused", phaseIs(flashsalev1alpha1.PhasePaused))
	if r, _ := eng.Reserve(context.Background(), "paused-buyer", "r", 1); r.Reason != stock.StatePaused {
		t.Fatalf("paused: %+v", r)
	}
	updateSpec(t, e.ns, "restock", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = false })
	e.waitFor("restock", settle, "Open again", phaseIs(flashsalev1alpha1.PhaseOpen))

	// Restock +500: applied once, across many reconciles and a controller restart.
	updateSpec(t, e.ns, "restock", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Allocation = 600 })
	e.waitFor("restock", settle, "restocked", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Allocation == 600 && fs.Status.Available == 595
	})
	time.Sleep(3 * time.Second) // several status refreshes
	stop()
	e.startController()
	time.Sleep(3 * time.Second)
	fs = e.waitFor("restock", settle, "still 595", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Allocation == 600 && fs.Status.Sold == 5
	})
	if fs.Status.Available != 595 {
		t.Fatalf("restock applied twice: available %d", fs.Status.Available)
	}
	if !hasEvent(t, e.ns, "restock", controllers.ReasonRestocked) {
		t.Fatal("no Restocked event")
	}

	// Below sold: refused with a condition that says so; nothing changes.
	updateSpec(t, e.ns, "restock", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Allocation = 3 })
	fs = e.waitFor("restock", settle, "refusal", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, controllers.ConditionAllocationApplied, metav1.ConditionFalse)
	})
	c := meta.FindStatusCondition(fs.Status.Conditions, controllers.ConditionAllocationApplied)
	if c.Reason != controllers.ReasonAllocationRefused || !strings.Contains(c.Message, "5 units are sold") {
		t.Fatalf("condition %+v", c)
	}
	if fs.Status.Allocation != 600 || fs.Status.Available != 595 {
		t.Fatalf("a refused decrease changed the stock: %+v", fs.Status)
	}
	// The refusal stands while buyers keep reserving: one event, not one per
	// change of the counts; the generation is not observed and Ready says why.
	for i := range 3 {
		e.reserve(eng, fmt.Sprintf("after-refusal-%d", i))
	}
	fs = e.waitFor("restock", settle, "the new counts in the refusal", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, controllers.ConditionAllocationApplied)
		return c != nil && strings.Contains(c.Message, "3 reserved")
	})
	if n := countEvents(t, e.ns, "restock", controllers.ReasonAllocationRefused); n != 1 {
		t.Fatalf("%d %s events for one refused spec, want 1", n, controllers.ReasonAllocationRefused)
	}
	if fs.Status.ObservedGeneration == fs.Generation {
		t.Fatal("observedGeneration moved to a refused spec")
	}
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != controllers.ReasonAllocationRefused {
		t.Fatalf("Ready with a refused allocation: %+v", c)
	}
	// Above sold: units leave the available stock.
	updateSpec(t, e.ns, "restock", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Allocation = 50 })
	e.waitFor("restock", settle, "lowered", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Allocation == 50 && fs.Status.Available == 42 && conditionIs(fs, controllers.ConditionAllocationApplied, metav1.ConditionTrue) &&
			fs.Status.ObservedGeneration == fs.Generation
	})
}

// countEvents counts the Events of one reason about one object.
func countEvents(t *testing.T, ns, name, reason string) int {
	t.Helper()
	var list corev1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == name && ev.Reason == reason {
			n++
		}
	}
	return n
}

func TestRedisLostFailsClosedAndRebuilds(t *testing.T) {
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("lossy", 200)
	eng := e.engineFor(fs, r.Addr())
	ctx := context.Background()
	var pending []string
	for i := range 20 {
		res := e.reserve(eng, fmt.Sprintf("v-%d", i))
		if i < 8 {
			if _, err := eng.Checkout(ctx, fmt.Sprintf("v-%d", i), res.ID, "pay"); err != nil {
				t.Fatal(err)
			}
		} else {
			pending = append(pending, res.ID)
		}
	}
	e.waitFor("lossy", settle, "counts", func(fs *flashsalev1alpha1.FlashSale) bool { return fs.Status.Sold == 8 && fs.Status.Reserved == 12 })

	// Watch the phase as it changes: FailClosed must show within 5 s of the loss.
	w, err := k8s.Watch(ctx, &flashsalev1alpha1.FlashSaleList{}, client.InNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	// The loss can be seen once Redis answers again; a reconcile that found
	// it down in between retries within retryUnhealthy (3 s).
	lost := time.Now()
	var sawFailClosed time.Duration
	deadline := time.After(settle)
	for sawFailClosed == 0 {
		select {
		case ev := <-w.ResultChan():
			if got, ok := ev.Object.(*flashsalev1alpha1.FlashSale); ok && got.Status.Phase == flashsalev1alpha1.PhaseFailClosed {
				sawFailClosed = time.Since(lost)
				c := meta.FindStatusCondition(got.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy)
				if c == nil || c.Reason != controllers.ReasonRedisDataLost || !strings.Contains(c.Message, "rebuilt from the ledger") {
					t.Fatalf("RedisHealthy condition %+v", c)
				}
			}
		case <-deadline:
			t.Fatal("never saw FailClosed")
		}
	}
	t.Logf("FailClosed visible %s after the loss", sawFailClosed)
	if sawFailClosed > 5*time.Second {
		t.Fatalf("FailClosed showed %s after the loss", sawFailClosed)
	}
	fs = e.waitFor("lossy", settle, "Open after rebuild", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil
	})
	if fs.Status.Epoch != 2 || fs.Status.Available != 180 || fs.Status.Reserved != 12 || fs.Status.Sold != 8 {
		t.Fatalf("counts after rebuild %+v", fs.Status)
	}
	lr := fs.Status.LastRebuild
	if lr.Sold != 8 || lr.Reserved != 12 || lr.Available != 180 || lr.Reason == "" {
		t.Fatalf("lastRebuild %+v", lr)
	}
	if !hasEvent(t, e.ns, "lossy", controllers.ReasonRedisDataLost) || !hasEvent(t, e.ns, "lossy", controllers.ReasonRebuilt) {
		t.Fatal("missing loss/rebuild events")
	}
	// Reservations acknowledged before the loss still check out.
	for i, id := range pending {
		co, err := eng.Checkout(ctx, fmt.Sprintf("v-%d", i+8), id, "pay")
		if err != nil || co.Outcome != ledger.CheckoutCommitted {
			t.Fatalf("checkout after rebuild: %v %v", co.Outcome, err)
		}
	}
	e.waitFor("lossy", settle, "all sold", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Sold == 20 && fs.Status.Reserved == 0 && fs.Status.Available == 180
	})
	if fs.Generation != 1 {
		t.Fatalf("the controller changed the spec: generation %d", fs.Generation)
	}
}

// A reconcile held up by a slow ledger across the schedule's end gates the
// shards by the time it reaches them, not by the time it began. The refresh is
// a minute here, so only that reconcile can end the sale within the test.
func TestSlowReconcileAcrossTheScheduleEnd(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	late := e.lateClock()
	e.statusRefresh = time.Minute
	e.startController()
	e.apply(e.sale("slow", 10).schedule(time.Time{}, time.Now().Add(time.Hour)))
	e.waitFor("slow", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	release := e.holdLedger("LOCK TABLE flashsale_campaigns IN ACCESS EXCLUSIVE MODE")
	// A label change starts a reconcile, which waits for the table.
	update(t, e.get("slow"), func(fs *flashsalev1alpha1.FlashSale) { fs.Labels = map[string]string{"team": "drops"} })
	e.waitForLockWaiter("the reconcile waiting for the ledger")
	late.Store(true)
	release()
	e.waitFor("slow", settle, "Completed", phaseIs(flashsalev1alpha1.PhaseCompleted))
}

// status.countsObservedAt says how old the counts are: renewed while Redis
// and the ledger can be read, even when nothing changes, and left as it was
// when they cannot, so stale counts show as such.
func TestCountsSayHowOldTheyAre(t *testing.T) {
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	e.countsStamp = time.Second
	e.startController()
	first := e.openSale("counted", 10).Status.CountsObservedAt
	if first == nil {
		t.Fatal("no countsObservedAt")
	}
	e.waitFor("counted", settle, "countsObservedAt renewed", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.CountsObservedAt.After(first.Time)
	})
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("counted", settle, "RedisHealthy False", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse)
	})
	last := fs.Status.CountsObservedAt
	time.Sleep(3 * time.Second)
	if at := e.get("counted").Status.CountsObservedAt; !at.Equal(last) {
		t.Fatalf("countsObservedAt moved from %s to %s while Redis was down", last, at)
	}
	out := kubectl(t, "get", "fs", "counted", "-n", e.ns, "-o", "wide")
	if !strings.Contains(out, "COUNTED") {
		t.Fatalf("kubectl get fs -o wide has no COUNTED column:\n%s", out)
	}
}

// A reconcile that reads the sale from a cache behind its last status write
// does not write over it: its conditions and events would come from the
// older status (here Redis unreachable an hour ago, which would be written
// as recovered just now). What it did is still said: here it paused the
// sale, as the older spec asked.
func TestStatusFromAStaleCacheIsNotWritten(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("behind", 10)
	old := e.get("behind")
	old.Spec.Paused = true
	hourAgo := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	meta.SetStatusCondition(&old.Status.Conditions, metav1.Condition{Type: flashsalev1alpha1.ConditionRedisHealthy,
		Status: metav1.ConditionFalse, Reason: controllers.ReasonUnreachable, Message: "no answer", LastTransitionTime: hourAgo})
	// A newer version of the sale exists.
	update(t, e.get("behind"), func(fs *flashsalev1alpha1.FlashSale) { fs.Annotations = map[string]string{"note": "newer"} })
	healthy := func() metav1.Time {
		t.Helper()
		c := meta.FindStatusCondition(e.get("behind").Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy)
		if c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("RedisHealthy %+v", c)
		}
		return c.LastTransitionTime
	}
	since := healthy()
	time.Sleep(time.Until(since.Add(1100 * time.Millisecond))) // a rewrite would show in the stored second
	e.stale.Store(old)
	res, err := e.reconciler.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(old)})
	e.stale.Store(nil)
	if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter >= time.Second {
		t.Fatalf("reconcile from a stale copy: %+v %v, want a retry soon and no error", res, err)
	}
	if now := healthy(); !now.Equal(&since) {
		t.Fatalf("RedisHealthy rewritten from a stale copy: True since %s, was since %s", now, since)
	}
	if !hasEventSaying(t, e.ns, "behind", controllers.ReasonGateChanged, stock.StatePaused) {
		t.Fatal("no GateChanged event for the pause the stale reconcile wrote")
	}
	if hasEvent(t, e.ns, "behind", controllers.ReasonRedisRecovered) {
		t.Fatal("RedisRecovered emitted from a stale copy")
	}
	// The sale as stored is not paused: the next reconcile opens it again.
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr()})
	defer rdb.Close()
	store := stock.New(rdb, string(old.UID), int(ptr.Deref(old.Spec.Shards, 10)))
	testharness.Eventually(t, settle, "every shard open again", func() bool {
		states, err := store.State(context.Background())
		return err == nil && !slices.ContainsFunc(states, func(st stock.ShardState) bool { return st.State != stock.StateOpen })
	})
}

// A reconcile that rebuilds the stock but read a stale status still writes
// the rebuild's record: no later reconcile could tell that it happened.
func TestRebuildOnAStaleReadIsRecorded(t *testing.T) {
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	e.statusRefresh = time.Minute // only the reconciles below run, once the creation's are over
	e.startController()
	e.openSale("stale-rebuild", 10)
	fs := e.settled("stale-rebuild")
	// The stored sale moves on, and the copy read is older, with another
	// status: the sale failed closed, as the reconcile that found the loss
	// wrote it.
	e.holdFinalizer("stale-rebuild")
	old := fs.DeepCopy()
	old.Status.Phase = flashsalev1alpha1.PhaseFailClosed
	old.Status.Reserved++
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, runID, _ := strings.Cut(info, "run_id:")
	runID, _, _ = strings.Cut(runID, "\r\n")
	if st := e.get("stale-rebuild").Status; st.LastRebuild != nil || len(st.RedisServers) != 1 || st.RedisServers[0].RunID == runID {
		t.Fatalf("before the reconciles below: lastRebuild %+v, redisServers %+v", st.LastRebuild, st.RedisServers)
	}
	e.stale.Store(old)
	defer e.stale.Store(nil)
	// Rebuilt: every status write is refused as stale.
	for range 5 {
		res, err := e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(fs)})
		if err != nil || res.RequeueAfter <= 0 {
			t.Fatalf("reconcile from a stale copy: %+v %v", res, err)
		}
		if e.get("stale-rebuild").Status.LastRebuild != nil {
			break
		}
	}
	live := e.get("stale-rebuild")
	if live.Status.LastRebuild == nil {
		t.Fatal("no record of the rebuild")
	}
	// The restarted server's run id: a restarted operator must not take it
	// for a server restarted since.
	if len(live.Status.RedisServers) != 1 || live.Status.RedisServers[0].RunID != runID {
		t.Fatalf("redisServers %+v, want the restarted server's run id %s", live.Status.RedisServers, runID)
	}
	if live.Status.Reserved == old.Status.Reserved {
		t.Fatal("the stale status was written")
	}
	if !hasEvent(t, e.ns, "stale-rebuild", controllers.ReasonRebuilt) {
		t.Fatal("no Rebuilt event")
	}
	if n := countEvents(t, e.ns, "stale-rebuild", controllers.ReasonRebuilt); n != 1 {
		t.Fatalf("%d Rebuilt events for one rebuild", n)
	}
}

// A change that leaves the status as it was (here another tool's finalizer)
// made while a reconcile runs does not cost that reconcile its status write:
// what it found (new counts here, a rebuild in earnest) is written.
func TestStatusIsWrittenOverAChangeThatLeftItAlone(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.countsStamp = 100 * time.Millisecond // every reconcile writes the status
	e.statusRefresh = time.Minute          // and none runs unless asked
	e.startController()
	e.openSale("edited", 10)
	read := e.settled("edited")
	e.holdFinalizer("edited")
	if now := e.get("edited"); !equality.Semantic.DeepEqual(now.Status, read.Status) || now.ResourceVersion == read.ResourceVersion {
		t.Fatal("the status changed, or the finalizer did not: the test needs the status as it was read")
	}
	time.Sleep(time.Until(read.Status.CountsObservedAt.Add(1100 * time.Millisecond))) // a new stamp shows in the stored second
	e.stale.Store(read)
	_, err := e.reconciler.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(read)})
	e.stale.Store(nil)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if got := e.get("edited").Status.CountsObservedAt; !got.After(read.Status.CountsObservedAt.Time) {
		t.Fatalf("countsObservedAt %s, read as %s: the status was not written", got, read.Status.CountsObservedAt)
	}
}

// While reservations move the counts, the status is written about once per
// refresh (1 s here), not once per reconcile that each write would start.
func TestStatusWritesFollowTheRefresh(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("busy", 1000)
	eng := e.engineFor(fs, sharedRedis.Addr())
	ctx := context.Background()
	w, err := k8s.Watch(ctx, &flashsalev1alpha1.FlashSaleList{}, client.InNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var writes atomic.Int64
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				writes.Add(1)
			}
		}
	}()
	const load = 6 * time.Second
	stop := time.Now().Add(load)
	reserved := 0
	for ; time.Now().Before(stop); reserved++ {
		e.reserve(eng, fmt.Sprintf("buyer-%d", reserved))
		time.Sleep(20 * time.Millisecond)
	}
	// One write per refresh, and a few for the Deployments' own changes.
	t.Logf("%d status writes", writes.Load())
	if n := writes.Load(); n > 15 {
		t.Fatalf("%d status writes in %s of reservations", n, load)
	}
	e.waitFor("busy", settle, "the counts", func(fs *flashsalev1alpha1.FlashSale) bool { return fs.Status.Reserved == int64(reserved) })
}

// A sale that has not started is refreshed every 10 s, not at the live
// refresh: a GitOps pipeline may hold many drops scheduled days ahead.
func TestScheduledSaleIsRefreshedSlowly(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.countsStamp = 100 * time.Millisecond // every refresh writes the status
	e.startController()
	e.apply(e.sale("later", 10).schedule(time.Now().Add(time.Hour), time.Time{}))
	e.waitFor("later", settle, "Scheduled", phaseIs(flashsalev1alpha1.PhaseScheduled))
	time.Sleep(3 * time.Second) // the creation's own reconciles, on a slow machine too
	ctx := context.Background()
	w, err := k8s.Watch(ctx, &flashsalev1alpha1.FlashSaleList{}, client.InNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var writes atomic.Int64
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				writes.Add(1)
			}
		}
	}()
	time.Sleep(5 * time.Second)
	if n := writes.Load(); n > 2 {
		t.Fatalf("%d status writes in 5 s for a sale that starts in an hour", n)
	}
}

// A rebuild that runs across the schedule's end opens the shards ended, and
// the status of that reconcile says so: the shards open in the state of the
// moment they open, not of the moment the reconcile began. Here the rebuild
// waits on the campaign row, held by the test, while the clock passes the end.
func TestRebuildAcrossTheScheduleEnd(t *testing.T) {
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	late := e.lateClock()
	e.startController()
	e.apply(e.sale("edge", 50).schedule(time.Time{}, time.Now().Add(time.Hour)))
	fs := e.waitFor("edge", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	eng := e.engineFor(fs, r.Addr())
	e.reserve(eng, "early")

	ctx := context.Background()
	release := e.holdLedger("SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE", string(fs.UID))
	w, err := k8s.Watch(ctx, &flashsalev1alpha1.FlashSaleList{}, client.InNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	e.waitForLockWaiter("the rebuild waiting for the campaign row")
	late.Store(true)
	release()
	deadline := time.After(settle)
	for {
		select {
		case ev := <-w.ResultChan():
			got, ok := ev.Object.(*flashsalev1alpha1.FlashSale)
			if !ok || got.Status.LastRebuild == nil {
				continue
			}
			if got.Status.Phase != flashsalev1alpha1.PhaseEnded {
				t.Fatalf("the rebuilt sale is %s, not Ended, past its end", got.Status.Phase)
			}
			states, err := eng.Store().State(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range states {
				if s.State != stock.StateEnded {
					t.Fatalf("shard %d is %s after a rebuild past the end", s.Index, s.State)
				}
			}
			return
		case <-deadline:
			t.Fatal("no status with the rebuild")
		}
	}
}

// Redis restarts from an older snapshot while the operator is down too: the
// restarted operator knows the old run id from the status, fails closed and
// rebuilds, so reservations missing from the snapshot are not sold twice. The
// shards' metas record no server here (as if seeded by an older version), so
// the status is all that tells.
func TestRedisRestartedWhileOperatorDown(t *testing.T) {
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	stop := e.startController()
	fs := e.apply(e.sale("snapshot", 100))
	fs = e.waitFor("snapshot", settle, "Open, run id recorded", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && len(fs.Status.RedisServers) == 1
	})
	oldRunID := fs.Status.RedisServers[0].RunID
	if fs.Status.RedisServers[0].Address != r.Addr() || len(oldRunID) != 40 {
		t.Fatalf("redisServers %+v", fs.Status.RedisServers)
	}
	// A shard seeded before metas recorded their server is stamped by the
	// controller once it has checked the server.
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	meta := stock.ShardKeys(string(fs.UID), 0).Meta()
	if err := rdb.HDel(context.Background(), meta, "srv").Err(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("snapshot", settle, "shard 0 stamped again", func(*flashsalev1alpha1.FlashSale) bool {
		return rdb.HGet(context.Background(), meta, "srv").Val() == oldRunID
	})
	eng := e.engineFor(fs, r.Addr())
	for i := range 5 {
		e.reserve(eng, fmt.Sprintf("before-%d", i))
	}
	stop()

	for i := range 4 {
		if err := rdb.HDel(context.Background(), stock.ShardKeys(string(fs.UID), i).Meta(), "srv").Err(); err != nil {
			t.Fatal(err)
		}
	}
	// A snapshot, five more acknowledged reservations, then a crash: the
	// restarted server has the snapshot's stock, the ledger all ten.
	if err := rdb.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		e.reserve(eng, fmt.Sprintf("after-%d", i))
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	n, err := eng.Counts(context.Background())
	if err != nil || n.Available != 95 {
		t.Fatalf("the snapshot's stock: %+v %v", n, err)
	}

	e.startController()
	fs = e.waitFor("snapshot", settle, "rebuilt and Open", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil
	})
	if !strings.Contains(fs.Status.LastRebuild.Reason, "restarted") || fs.Status.LastRebuild.Reserved != 10 {
		t.Fatalf("lastRebuild %+v", fs.Status.LastRebuild)
	}
	fs = e.waitFor("snapshot", settle, "counts from the ledger", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Available == 90 && fs.Status.Reserved == 10
	})
	if len(fs.Status.RedisServers) != 1 || fs.Status.RedisServers[0].RunID == oldRunID || fs.Status.Epoch != 2 {
		t.Fatalf("after the rebuild: epoch %d, redisServers %+v", fs.Status.Epoch, fs.Status.RedisServers)
	}
	if !hasEvent(t, e.ns, "snapshot", controllers.ReasonRedisDataLost) {
		t.Fatal("no RedisDataLost event")
	}
	// A reconcile that reads the status from before the rebuild was written
	// (a cache that has not caught up) does not rebuild a second time.
	before := fs.DeepCopy()
	fs.Status.Phase = flashsalev1alpha1.PhaseFailClosed
	if err := k8s.Status().Patch(context.Background(), fs, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	fs = e.waitFor("snapshot", settle, "Open again", phaseIs(flashsalev1alpha1.PhaseOpen))
	if fs.Status.Epoch != 2 {
		t.Fatalf("rebuilt again on a stale phase: epoch %d", fs.Status.Epoch)
	}
}

func TestLedgerDownStaysClosed(t *testing.T) {
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	e.startController()
	e.openSale("ledgerless", 10)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("ledgerless", settle, "LedgerHealthy False", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse)
	})
	c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy)
	if !strings.Contains(c.Message, "ledger") {
		t.Fatalf("condition %+v", c)
	}
	// kubectl get says so, whatever the phase: not admitting, and why.
	e.waitFor("ledgerless", settle, "Admitting False", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse)
	})
	out := kubectl(t, "get", "fs", "ledgerless", "-n", e.ns, "-o", "wide")
	header, row, _ := strings.Cut(out, "\n")
	cols := map[string]string{}
	for i, name := range strings.Fields(header) {
		if f := strings.Fields(row); i < len(f) {
			cols[name] = f[i]
		}
	}
	if cols["ADMITTING"] != "False" || cols["READY"] != "False" || cols["REASON"] != controllers.ReasonLedgerUnreachable {
		t.Fatalf("kubectl get fs -o wide while the ledger is down:\n%s", out)
	}
	// Redis loses its data while the ledger is down: closed, and it says why.
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	fs = e.waitFor("ledgerless", settle, "still closed", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseFailClosed || conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse)
	})
	if conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue) {
		t.Fatalf("Ready while the ledger is down: %+v", fs.Status.Conditions)
	}
	// One event when it went down, whatever the reconciles since.
	if !hasEvent(t, e.ns, "ledgerless", controllers.ReasonLedgerUnreachable) {
		t.Fatal("no event when the ledger went down")
	}
	if n := countEvents(t, e.ns, "ledgerless", controllers.ReasonLedgerUnreachable); n != 1 {
		t.Fatalf("%d LedgerUnreachable events", n)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("ledgerless", 30*time.Second, "Open after recovery", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue) && fs.Status.Available == 10
	})
	if !hasEvent(t, e.ns, "ledgerless", controllers.ReasonLedgerRecovered) {
		t.Fatal("no event when the ledger answered again")
	}
}

// The ledger back while Redis is still down shows as such, with its event:
// the reconcile stops at Redis before any query of its own reaches the ledger.
func TestLedgerRecoversWhileRedisIsDown(t *testing.T) {
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	e.startController()
	e.openSale("both", 10)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("both", settle, "LedgerHealthy False", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse)
	})
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("both", 30*time.Second, "LedgerHealthy True with Redis down", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue)
	})
	if !conditionIs(fs, flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse) {
		t.Fatalf("RedisHealthy %+v", meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy))
	}
	if !hasEvent(t, e.ns, "both", controllers.ReasonLedgerRecovered) {
		t.Fatal("no LedgerRecovered event")
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("both", 30*time.Second, "Open again", phaseIs(flashsalev1alpha1.PhaseOpen))
}

// The pause switch and the schedule's end close the shards while the operator
// cannot reach the ledger, with or without connections of its own: the
// reserve pods may still reach it and would go on selling. Opening waits for
// the ledger.
func TestClosingDoesNotWaitForTheLedger(t *testing.T) {
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	late := e.lateClock()
	stop := e.startController()
	e.apply(e.sale("unledgered", 10).schedule(time.Time{}, time.Now().Add(time.Hour)))
	fs := e.waitFor("unledgered", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	store := stock.New(rdb, string(fs.UID), 4)
	gates := func() []string {
		states, err := store.State(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, st := range states {
			out = append(out, st.State)
		}
		return out
	}
	every := func(want string) func() bool {
		return func() bool { return !slices.ContainsFunc(gates(), func(g string) bool { return g != want }) }
	}
	ledgerDown := func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse)
	}

	// Restarted while the ledger is down: nothing of its own reaches it.
	stop()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	e.startController()
	updateSpec(t, e.ns, "unledgered", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	testharness.Eventually(t, settle, "every shard PAUSED", every(stock.StatePaused))
	fs = e.waitFor("unledgered", settle, "Paused with the ledger down", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhasePaused && ledgerDown(fs)
	})
	if conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionTrue) {
		t.Fatalf("Admitting while the ledger is down: %+v", fs.Status.Conditions)
	}
	if !hasEvent(t, e.ns, "unledgered", controllers.ReasonGateChanged) {
		t.Fatal("no GateChanged event")
	}

	// Unpaused: the shards stay closed until the ledger answers.
	updateSpec(t, e.ns, "unledgered", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = false })
	time.Sleep(3 * time.Second) // several reconciles (status refresh 1s)
	if g := gates(); slices.Contains(g, stock.StateOpen) {
		t.Fatalf("shards %v opened without the ledger", g)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 30*time.Second, "every shard OPEN once the ledger is back", every(stock.StateOpen))

	// Down again, with the operator's connections open: the end closes it.
	e.waitFor("unledgered", settle, "LedgerHealthy True", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue)
	})
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("unledgered", settle, "LedgerHealthy False", ledgerDown)
	late.Store(true)
	testharness.Eventually(t, settle, "every shard ENDED past the end", every(stock.StateEnded))
	// Ended, not Completed: whether anything is still reserved needs the
	// ledger's counts.
	e.waitFor("unledgered", settle, "Ended", phaseIs(flashsalev1alpha1.PhaseEnded))
	time.Sleep(2 * time.Second)
	if fs := e.get("unledgered"); fs.Status.Phase != flashsalev1alpha1.PhaseEnded {
		t.Fatalf("phase %s with the ledger down past the end, want Ended", fs.Status.Phase)
	}
}

// A ledger that hangs (here: its campaigns table locked) rather than refusing
// does not hold the pause up either: the gate is written before the phases
// that wait on the ledger, within seconds, not at the reconcile's deadline.
func TestClosingDoesNotWaitForAHungLedger(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.statusRefresh = time.Minute // no refresh of its own meanwhile
	e.phaseTimeout = 10 * time.Second
	stop := e.startController()
	fs := e.openSale("stalled", 10)
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	store := stock.New(rdb, string(fs.UID), 4)
	every := func(want string) func() bool {
		return func() bool {
			states, err := store.State(context.Background())
			return err == nil && !slices.ContainsFunc(states, func(st stock.ShardState) bool { return st.State != want })
		}
	}
	time.Sleep(2 * time.Second) // the creation's own reconciles are over
	release := e.holdLedger("LOCK TABLE flashsale_campaigns IN ACCESS EXCLUSIVE MODE")
	updateSpec(t, e.ns, "stalled", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	// Nothing else would close it while the ledger hangs: the operator's
	// connections are open, so no step fails to open them. (The window
	// allows for a reconcile already waiting on the ledger.)
	testharness.Eventually(t, 2*e.phaseTimeout, "every shard PAUSED while the ledger hangs", every(stock.StatePaused))

	// Restarted while it hangs, even to open a connection (the migrations'
	// table locked too): a deletion ends the sale through Redis once the
	// steps waiting on the ledger have given up, and waits.
	stop()
	releaseMigrations := e.holdLedger("LOCK TABLE flashsale_schema_migrations IN ACCESS EXCLUSIVE MODE")
	e.startController()
	ctx := context.Background()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 3*e.phaseTimeout+15*time.Second, "every shard ENDED while the ledger hangs", every(stock.StateEnded))
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "stalled"}, &flashsalev1alpha1.FlashSale{}); err != nil {
		t.Fatalf("deleted while the ledger hangs: %v", err)
	}
	releaseMigrations()
	release()
	e.waitGone("stalled", settle)
}

func TestMissingSecretOrKeyIsNamed(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.apply(e.sale("orphan", 10).redisSecret("nowhere"))
	fs := e.waitFor("orphan", settle, "SecretNotFound", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonSecretNotFound))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); !strings.Contains(c.Message, `"nowhere"`) {
		t.Fatalf("message does not name the Secret: %s", c.Message)
	}
	if conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue) {
		t.Fatal("seeded without its Secret")
	}
	if fs.Status.ObservedGeneration != 0 {
		t.Fatalf("observedGeneration %d: nothing of the spec was applied", fs.Status.ObservedGeneration)
	}
	// The Secret appears, but without the key.
	e.create(e.secret("nowhere", map[string]string{"adresses": sharedRedis.Addr()}))
	fs = e.waitFor("orphan", settle, "SecretKeyMissing", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonSecretKeyMissing))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); !strings.Contains(c.Message, `"addresses"`) {
		t.Fatalf("message does not name the key: %s", c.Message)
	}
	// Fixed: the sale seeds.
	var s corev1.Secret
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "nowhere"}, &s); err != nil {
		t.Fatal(err)
	}
	s.Data = map[string][]byte{"addresses": []byte(sharedRedis.Addr())}
	if err := k8s.Update(context.Background(), &s); err != nil {
		t.Fatal(err)
	}
	e.waitFor("orphan", settle, "Seeded", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue)
	})
}

// A Secret deleted during the sale (a rotation by delete and recreate, a GitOps
// prune) is named in Ready, and the pause switch still closes the sale through
// the connections opened before.
func TestSecretDeletedDuringTheSaleStillPauses(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	fs := e.openSale("rotated", 10)
	eng := e.engineFor(fs, sharedRedis.Addr())
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "waiting-room", Namespace: e.ns}}
	if err := k8s.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	e.waitFor("rotated", settle, "SecretNotFound", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonSecretNotFound))
	updateSpec(t, e.ns, "rotated", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	fs = e.waitFor("rotated", settle, "Paused", phaseIs(flashsalev1alpha1.PhasePaused))
	if fs.Status.ObservedGeneration == fs.Generation {
		t.Fatal("observedGeneration moved while the spec's Secret is missing")
	}
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c == nil || c.Reason != controllers.ReasonSecretNotFound {
		t.Fatalf("Ready while the Secret is missing: %+v", c)
	}
	if r, err := eng.Reserve(ctx, "late-buyer", "r", 1); err != nil || r.Reason != stock.StatePaused {
		t.Fatalf("reserve while paused: %+v %v", r, err)
	}
	// The replicas still follow the spec; the pods stay as they are, since
	// new ones would not find the Secret.
	before := e.deployment("rotated-reserve").Spec.Template
	// The placement first: the reconcile that applies the scale has seen it.
	updateSpec(t, e.ns, "rotated", func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Pods = &flashsalev1alpha1.PodsSpec{NodeSelector: map[string]string{"pool": "drop"}}
	})
	kubectl(t, "scale", "flashsale", "rotated", "-n", e.ns, "--replicas=3")
	testharness.Eventually(t, settle, "the reserve Deployment at 3 replicas", func() bool {
		return *e.deployment("rotated-reserve").Spec.Replicas == 3
	})
	if after := e.deployment("rotated-reserve").Spec.Template; !equality.Semantic.DeepEqual(before, after) {
		t.Fatalf("the reserve pods rolled while the Secret is missing: %+v", after.Spec.NodeSelector)
	}
	// A Deployment that lost its labels meanwhile gets them back.
	update(t, e.deployment("rotated-reserve"), func(d *appsv1.Deployment) { delete(d.Labels, controllers.LabelManagedBy) })
	testharness.Eventually(t, settle, "the managed-by label back", func() bool {
		return e.deployment("rotated-reserve").Labels[controllers.LabelManagedBy] == controllers.ManagedBy
	})
	// An operator restarted meanwhile has no connections to go on with: it
	// checks nothing, and does not present what it found before as current.
	stop()
	e.startController()
	fs = e.waitFor("rotated", settle, "Admitting Unknown", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionUnknown)
	})
	for _, c := range []string{flashsalev1alpha1.ConditionRedisHealthy, flashsalev1alpha1.ConditionLedgerHealthy} {
		if !conditionIs(fs, c, metav1.ConditionUnknown) {
			t.Errorf("%s after a restart without the Secret: %+v", c, meta.FindStatusCondition(fs.Status.Conditions, c))
		}
	}
	// The Secret is back: Ready no longer names it.
	e.create(e.secret("waiting-room", map[string]string{"hmac-key": admissionKey}))
	e.waitFor("rotated", settle, "Secret found again", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
		return c != nil && c.Reason != controllers.ReasonSecretNotFound &&
			conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse) && // paused
			conditionIs(fs, flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionTrue) &&
			conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue)
	})
}

// Ready is decided once per reconcile: a problem that does not stop the
// phases (here a Secret deleted mid-sale) keeps Ready False with a steady
// lastTransitionTime, instead of a True then False on every status refresh.
func TestReadyDoesNotFlapWhileNotReady(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.apply(e.sale("steady", 10))
	markReady(t, e.ns, "steady-reserve")
	markReady(t, e.ns, "steady-sweeper")
	e.waitFor("steady", settle, "Ready", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue)
	})
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "waiting-room", Namespace: e.ns}}
	if err := k8s.Delete(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("steady", settle, "SecretNotFound", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonSecretNotFound))
	since := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady).LastTransitionTime
	time.Sleep(3500 * time.Millisecond) // three status refreshes, in other seconds
	c := meta.FindStatusCondition(e.get("steady").Status.Conditions, flashsalev1alpha1.ConditionReady)
	if c.Status != metav1.ConditionFalse || !c.LastTransitionTime.Equal(&since) {
		t.Fatalf("Ready %s since %s, want False since %s", c.Status, c.LastTransitionTime, since)
	}
}

// A child the controller cannot write (here a Deployment of the same name that
// is not the sale's) is named in Ready, and the sale is still gated and
// observed on time: the schedule's end closes it.
func TestChildThatCannotBeWrittenDoesNotStallTheSale(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.create(e.foreignDeployment("clash-reserve"))
	e.startController()
	// Far enough out that a controller on its error backoff (5 ms doubling,
	// so about 5 s, 10 s, 20 s after the start) would miss the end by seconds.
	end := time.Now().Add(11 * time.Second)
	e.apply(e.sale("clash", 10).schedule(time.Time{}, end))
	fs := e.waitFor("clash", settle, "ChildrenFailed", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonChildrenFailed))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); !strings.Contains(c.Message, "Deployment clash-reserve") {
		t.Fatalf("Ready does not name the child: %s", c.Message)
	}
	if fs.Status.ObservedGeneration != 0 {
		t.Fatalf("observedGeneration %d while a child cannot be written", fs.Status.ObservedGeneration)
	}
	// Sales go on while it fails (the counts change the status at every
	// refresh): one event says so, not one per reconcile.
	eng := e.engineFor(fs, sharedRedis.Addr())
	ctx := context.Background()
	// Until shortly before the end, however long the sale took to open.
	bought := 0
	for ; bought < 6 && time.Until(end) > 2*time.Second; bought++ {
		e.reserve(eng, fmt.Sprintf("buyer-%d", bought))
		time.Sleep(700 * time.Millisecond)
	}
	if bought < 2 {
		t.Fatalf("%d reservations before the end: the sale opened too late to tell", bought)
	}
	if n := countEvents(t, e.ns, "clash", controllers.ReasonChildrenFailed); n != 1 {
		t.Fatalf("%d ChildrenFailed events while the same child failed", n)
	}
	e.waitFor("clash", time.Until(end)+5*time.Second, "Admitting False, Ended", reasonIs(flashsalev1alpha1.ConditionAdmitting, controllers.ReasonEnded))
	if r, err := eng.Reserve(ctx, "late-buyer", "r", 1); err != nil || r.Reason != stock.StateEnded {
		t.Fatalf("reserve after the end: %+v %v", r, err)
	}
	// Deleting the sale leaves the Deployment that is not its own.
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	e.waitGone("clash", settle)
	var d appsv1.Deployment
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "clash-reserve"}, &d); err != nil || !d.DeletionTimestamp.IsZero() {
		t.Fatalf("the Deployment that was not the sale's was deleted with it: %v", err)
	}
}

// The data-plane pods read their Secrets once, from their environment: a
// change to a value they read changes their pod template's fingerprint, so
// their Deployment rolls them onto it. The sweeper does not read the
// admission key, so a rotated admission key leaves its pods alone.
func TestSecretChangeRollsThePodsThatReadIt(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("rolled", 10)
	fingerprints := func() (reserve, sweeper string) {
		for _, c := range []struct {
			name string
			out  *string
		}{{"rolled-reserve", &reserve}, {"rolled-sweeper", &sweeper}} {
			*c.out = e.deployment(c.name).Spec.Template.Annotations[controllers.AnnotationSecrets]
		}
		return reserve, sweeper
	}
	var r0, s0 string
	testharness.Eventually(t, settle, "fingerprints on both pod templates", func() bool {
		r0, s0 = fingerprints()
		return r0 != "" && s0 != ""
	})
	for _, secret := range []string{e.redisAddr, e.dsn, admissionKey} {
		if strings.Contains(r0+s0, secret) {
			t.Fatal("a fingerprint shows a Secret value")
		}
	}
	e.setSecret("waiting-room", "hmac-key", "a-rotated-admission-key-0123456789")
	var r1, s1 string
	testharness.Eventually(t, settle, "the reserve pods rolled", func() bool { r1, s1 = fingerprints(); return r1 != r0 })
	if s1 != s0 {
		t.Fatal("a rotated admission key rolled the sweeper, which does not read it")
	}

	e.setSecret("shop-ledger", "dsn", e.dsn+"&application_name=flashsale-rolled")
	testharness.Eventually(t, settle, "both rolled", func() bool {
		r2, s2 := fingerprints()
		return r2 != r1 && s2 != s1
	})
}

// Wrong Redis credentials and an ACL user missing a command the operator needs
// each say so in the Ready reason, and nothing is seeded until they are fixed.
func TestRedisCredentialsAndPermissionsAreNamed(t *testing.T) {
	r := testharness.RedisT(t)
	admin := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	ctx := context.Background()
	// Everything but INFO, which tells a restarted server from the one checked.
	if err := admin.Do(ctx, "ACL", "SETUSER", "shop", "on", ">s3cret", "~*", "&*", "+@all", "-info").Err(); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, r.Addr(), sharedPG)
	e.create(e.secret("acl-redis", map[string]string{"addresses": r.Addr(), "username": "shop", "password": "wrong"}))
	e.startController()
	e.apply(e.sale("acl", 10).redisSecret("acl-redis"))
	forbidden := func(word string) func(*flashsalev1alpha1.FlashSale) bool {
		return func(fs *flashsalev1alpha1.FlashSale) bool {
			c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
			return c != nil && c.Reason == controllers.ReasonRedisForbidden && strings.Contains(c.Message, word)
		}
	}
	fs := e.waitFor("acl", settle, "RedisForbidden (WRONGPASS)", forbidden("WRONGPASS"))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy); c == nil || c.Reason != controllers.ReasonForbidden {
		t.Fatalf("RedisHealthy %+v", c)
	}

	e.setSecret("acl-redis", "password", "s3cret")
	e.waitFor("acl", settle, "RedisForbidden (NOPERM info)", forbidden("info"))
	if n, err := admin.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("seeded without the permissions it needs: %d keys, %v", n, err)
	}

	if err := admin.Do(ctx, "ACL", "SETUSER", "shop", "+info").Err(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("acl", settle, "Open with the permission granted", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.Available == 10
	})
}

// A ledger DSN whose role PostgreSQL refuses says so in the Ready reason.
func TestLedgerCredentialsAreNamed(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	u, err := url.Parse(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("nobody")
	e.create(e.secret("stranger-ledger", map[string]string{"dsn": u.String()}))
	e.startController()
	e.apply(e.sale("stranger", 10).ledgerSecret("stranger-ledger"))
	fs := e.waitFor("stranger", settle, "LedgerForbidden", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonLedgerForbidden))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy); c == nil || c.Reason != controllers.ReasonForbidden || !strings.Contains(c.Message, `"nobody"`) {
		t.Fatalf("LedgerHealthy %+v", c)
	}
	if conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue) {
		t.Fatal("seeded without its ledger")
	}
}

func TestDeleteCleansRedisKeepsLedger(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("doomed", 30)
	if len(fs.Finalizers) == 0 {
		t.Fatal("no finalizer")
	}
	eng := e.engineFor(fs, sharedRedis.Addr())
	ids := []string{e.reserve(eng, "a").ID, e.reserve(eng, "b").ID}
	ctx := context.Background()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(settle)
	for {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "doomed"}, &flashsalev1alpha1.FlashSale{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("FlashSale not gone: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	states, err := eng.Store().State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Present {
			t.Fatalf("shard %d still in Redis", s.Index)
		}
	}
	if n, _ := eng.Store().DeleteAll(ctx); n != 0 {
		t.Fatalf("%d Redis keys left", n)
	}
	for _, id := range ids {
		if o, err := eng.Ledger().GetOrder(ctx, id); err != nil || o.Status != ledger.StatusPending {
			t.Fatalf("ledger row %s: %+v %v", id, o, err)
		}
	}
	c, err := eng.Ledger().GetCampaign(ctx, string(fs.UID))
	if err != nil || c.DeletedAt == nil {
		t.Fatalf("ledger campaign %+v %v", c, err)
	}
	var d appsv1.Deployment
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "doomed-reserve"}, &d); !apierrors.IsNotFound(err) && d.DeletionTimestamp.IsZero() {
		t.Fatalf("reserve Deployment still there: %v", err)
	}
	var pdb policyv1.PodDisruptionBudget
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "doomed-reserve"}, &pdb); !apierrors.IsNotFound(err) && pdb.DeletionTimestamp.IsZero() {
		t.Fatalf("reserve PodDisruptionBudget still there: %v", err)
	}
	var idSecret corev1.Secret
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "doomed-ids"}, &idSecret); !apierrors.IsNotFound(err) && idSecret.DeletionTimestamp.IsZero() {
		t.Fatalf("id key Secret still there: %v", err)
	}
}

// A deletion that waits for Redis says so in an event, and completes once
// Redis is back.
func TestDeletionWaitingForRedisSaysWhy(t *testing.T) {
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("stuck", 10)
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	if !hasEvent(t, e.ns, "stuck", controllers.ReasonCleanupFailed) {
		t.Fatal("no event while the deletion waits for Redis")
	}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "stuck"}, &flashsalev1alpha1.FlashSale{}); err != nil {
		t.Fatalf("deleted without its cleanup: %v", err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitGone("stuck", 30*time.Second)
}

// A first seeding cut short (the operator restarted between the ledger's
// campaign and the last shard, or Redis refused a script until its ACL was
// fixed) is completed from the ledger, and reported as a seeding, not as
// Redis data loss: a sale that never opened does not fail closed.
func TestFirstSeedingCutShortIsCompleted(t *testing.T) {
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	fs := e.apply(e.sale("half", 10))
	ctx := context.Background()
	l, err := ledger.Open(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, _, err := l.EnsureCampaign(ctx, ledger.Campaign{ID: string(fs.UID), Namespace: e.ns, Name: fs.Name, SKU: fs.Spec.SKU, Allocation: 10, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	if _, err := stock.New(rdb, string(fs.UID), 4).Seed(ctx, 0, c.ShardAllocations[0], c.Epoch, stock.StateOpen, c.LastChangeID); err != nil {
		t.Fatal(err)
	}
	e.startController()
	fs = e.waitFor("half", settle, "Open, seeded", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue)
	})
	if fs.Status.Available != 10 || fs.Status.LastRebuild != nil {
		t.Fatalf("status after a first seeding completed: available %d, lastRebuild %+v", fs.Status.Available, fs.Status.LastRebuild)
	}
	if !hasEvent(t, e.ns, "half", controllers.ReasonSeeded) {
		t.Fatal("no Seeded event")
	}
	if n := countEvents(t, e.ns, "half", controllers.ReasonRedisDataLost); n != 0 {
		t.Fatalf("%d RedisDataLost events for a sale that never opened", n)
	}
}

// A sale deleted with its Secrets (a namespace deleted, a GitOps prune) is
// cleaned up with the connections the operator opened before; after an
// operator restart there are none, and the cleanup is skipped, saying so.
func TestDeletionWithItsSecrets(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	pruned := e.openSale("pruned", 10)
	orphaned := e.openSale("orphaned", 10)
	ctx := context.Background()
	cleaned := func(fs *flashsalev1alpha1.FlashSale) bool {
		t.Helper()
		rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr()})
		defer rdb.Close()
		states, err := stock.New(rdb, string(fs.UID), 4).State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l, err := ledger.Open(ctx, e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := l.GetCampaign(ctx, string(fs.UID))
		if err != nil {
			t.Fatal(err)
		}
		return !slices.ContainsFunc(states, func(st stock.ShardState) bool { return st.Present }) && c.DeletedAt != nil
	}
	for _, name := range []string{"shop-redis", "shop-ledger", "waiting-room"} {
		if err := k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := k8s.Delete(ctx, pruned); err != nil {
		t.Fatal(err)
	}
	e.waitGone("pruned", settle)
	if !cleaned(pruned) {
		t.Fatal("a sale deleted with its Secrets kept its Redis keys or ledger campaign")
	}
	// A reconcile queued by the children's deletion can read the sale from
	// a cache that still holds it with its finalizer.
	old := pruned.DeepCopy()
	old.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	old.Finalizers = []string{controllers.Finalizer}
	e.stale.Store(old)
	if _, err := e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pruned)}); err != nil {
		t.Fatalf("reconcile of a sale the cache still holds: %v", err)
	}
	e.stale.Store(nil)
	if hasEvent(t, e.ns, "pruned", controllers.ReasonCleanupSkipped) {
		t.Fatal("CleanupSkipped for a sale that was cleaned up")
	}

	stop()
	e.startController()
	if err := k8s.Delete(ctx, orphaned); err != nil {
		t.Fatal(err)
	}
	e.waitGone("orphaned", settle)
	if !hasEvent(t, e.ns, "orphaned", controllers.ReasonCleanupSkipped) {
		t.Fatal("no CleanupSkipped event")
	}
	if cleaned(orphaned) {
		t.Fatal("cleaned up without connections")
	}
}

// A deletion while the ledger is down closes the sale and waits: the Redis
// keys stay (every retry would scan a shared keyspace again) until the
// campaign can be marked deleted.
func TestDeletionWaitsForTheLedger(t *testing.T) {
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	e.startController()
	fs := e.openSale("waiting", 10)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	store := stock.New(rdb, string(fs.UID), 4)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	if !hasEvent(t, e.ns, "waiting", controllers.ReasonCleanupFailed) {
		t.Fatal("no event while the deletion waits for the ledger")
	}
	time.Sleep(2 * time.Second) // retries
	states, err := store.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range states {
		if !st.Present || st.State != stock.StateEnded {
			t.Fatalf("shard %d while the deletion waits for the ledger: present %v, %s", st.Index, st.Present, st.State)
		}
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitGone("waiting", 30*time.Second)
	if n, err := store.DeleteAll(ctx); err != nil || n != 0 {
		t.Fatalf("%d Redis keys left (%v)", n, err)
	}
}

// The same after an operator restart, with no connection of its own: the
// sale is ended through Redis alone while the deletion waits.
func TestDeletionAfterARestartWithTheLedgerDown(t *testing.T) {
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	stop := e.startController()
	fs := e.openSale("restarted", 10)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	store := stock.New(rdb, string(fs.UID), 4)
	stop()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	e.startController()
	ctx := context.Background()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, settle, "every shard ENDED, kept", func() bool {
		states, err := store.State(ctx)
		return err == nil && !slices.ContainsFunc(states, func(st stock.ShardState) bool { return !st.Present || st.State != stock.StateEnded })
	})
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitGone("restarted", 30*time.Second)
	if n, err := store.DeleteAll(ctx); err != nil || n != 0 {
		t.Fatalf("%d Redis keys left (%v)", n, err)
	}
}

// Each sale gets its own reservation id key in an immutable Secret owned by
// it, read by the reserve pods: rotating the admission key during the sale
// leaves it, and with it the ids, as they were. A sale whose reserve pods ran
// before the Secret existed gets the key those pods derived from the
// admission key, so its ids do not change either; a Secret deleted while the
// pods read it is not replaced by another key.
func TestReservationIDKeySecret(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	fs := e.apply(e.sale("keyed", 10))
	e.waitFor("keyed", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	ctx := context.Background()
	name := types.NamespacedName{Namespace: e.ns, Name: "keyed-ids"}
	idKey := func() []byte {
		var s corev1.Secret
		if err := k8s.Get(ctx, name, &s); err != nil {
			t.Fatal(err)
		}
		if !metav1.IsControlledBy(&s, fs) || s.Immutable == nil || !*s.Immutable {
			t.Fatalf("Secret %s: owners %v, immutable %v", name.Name, s.OwnerReferences, s.Immutable)
		}
		k, err := base64.RawURLEncoding.DecodeString(string(s.Data[controllers.SecretKeyIDKey]))
		if err != nil {
			t.Fatalf("id key: %v", err)
		}
		return k
	}
	key := idKey()
	if len(key) != 32 || string(key) == string(config.DeriveIDSecret([]byte(admissionKey))) {
		t.Fatalf("a new sale's id key must be 32 random bytes, got %d bytes", len(key))
	}
	var d appsv1.Deployment
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "keyed-reserve"}, &d); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range d.Spec.Template.Spec.Containers[0].Env {
		if v.Name == config.EnvIDKey && v.ValueFrom != nil && v.ValueFrom.SecretKeyRef != nil &&
			v.ValueFrom.SecretKeyRef.Name == name.Name && v.ValueFrom.SecretKeyRef.Key == controllers.SecretKeyIDKey {
			found = true
		}
	}
	if !found {
		t.Fatalf("the reserve pods do not read %s from Secret %s", config.EnvIDKey, name.Name)
	}

	// The admission key is rotated: the id key stays.
	var adm corev1.Secret
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "waiting-room"}, &adm); err != nil {
		t.Fatal(err)
	}
	adm.Data = map[string][]byte{"hmac-key": []byte("a-rotated-admission-key-0123456789")}
	if err := k8s.Update(ctx, &adm); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // reconciles with the new key
	if got := idKey(); string(got) != string(key) {
		t.Fatal("rotating the admission key changed the id key")
	}

	// Deleted while the reserve pods read it: not replaced by another key,
	// even when their Deployment lost its labels (and with them its place in
	// the controller's cache) at the same time.
	stop()
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "keyed-reserve"}, &d); err != nil {
		t.Fatal(err)
	}
	delete(d.Labels, controllers.LabelManagedBy)
	if err := k8s.Update(ctx, &d); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name.Name, Namespace: e.ns}}); err != nil {
		t.Fatal(err)
	}
	stop = e.startController()
	e.waitFor("keyed", settle, "ChildrenFailed", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
		return c != nil && c.Reason == controllers.ReasonChildrenFailed && strings.Contains(c.Message, "deleted while the reserve pods read it")
	})
	if err := k8s.Get(ctx, name, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the deleted id key Secret was recreated: %v", err)
	}

	// An upgrade from a version without the Secret: the reserve Deployment runs
	// pods that derive the key from the admission key. The key they derive is
	// written, not a new one.
	stop()
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "keyed-reserve"}, &d); err != nil {
		t.Fatal(err)
	}
	c := &d.Spec.Template.Spec.Containers[0]
	c.Env = slices.DeleteFunc(c.Env, func(v corev1.EnvVar) bool { return v.Name == config.EnvIDKey })
	if err := k8s.Update(ctx, &d); err != nil {
		t.Fatal(err)
	}
	e.startController()
	want := config.DeriveIDSecret([]byte("a-rotated-admission-key-0123456789"))
	var s corev1.Secret
	testharness.Eventually(t, settle, "Secret "+name.Name+" recreated", func() bool {
		return k8s.Get(ctx, name, &s) == nil && s.DeletionTimestamp.IsZero()
	})
	if string(s.Data[controllers.SecretKeyIDKey]) != base64.RawURLEncoding.EncodeToString(want) {
		t.Fatal("the recreated id key is not the one the running reserve pods derive")
	}
}

// The finalizer is added without writing the spec back: the stored spec stays
// as the manifest wrote it ("10m", a start with an offset), its generation
// stays 1, and a GitOps tool applying the same manifest server-side finds no
// field the controller took over.
func TestFinalizerLeavesTheSpecAsWritten(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	manifest := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": flashsalev1alpha1.GroupVersion.String(),
			"kind":       "FlashSale",
			"metadata":   map[string]any{"name": "as-written", "namespace": e.ns},
			"spec": map[string]any{
				"sku": "itm-as-written", "allocation": int64(20), "shards": int64(2),
				"schedule":    map[string]any{"start": "2020-01-01T10:00:00+01:00"},
				"reservation": map[string]any{"ttl": "10m", "gracePeriod": "0s"},
				"redis":       map[string]any{"secretRef": map[string]any{"name": "shop-redis"}},
				"postgres":    map[string]any{"secretRef": map[string]any{"name": "shop-ledger"}},
				"admission":   map[string]any{"secretRef": map[string]any{"name": "waiting-room"}},
			},
		}}
		return u
	}
	ctx := context.Background()
	if err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(manifest()), client.FieldOwner("gitops")); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("as-written", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	if len(fs.Finalizers) == 0 || fs.Generation != 1 {
		t.Fatalf("finalizers %v, generation %d", fs.Finalizers, fs.Generation)
	}
	stored := &unstructured.Unstructured{}
	stored.SetGroupVersionKind(flashsalev1alpha1.GroupVersion.WithKind("FlashSale"))
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "as-written"}, stored); err != nil {
		t.Fatal(err)
	}
	ttl, _, _ := unstructured.NestedString(stored.Object, "spec", "reservation", "ttl")
	start, _, _ := unstructured.NestedString(stored.Object, "spec", "schedule", "start")
	if ttl != "10m" || start != "2020-01-01T10:00:00+01:00" {
		t.Fatalf("stored spec rewritten: ttl %q, start %q", ttl, start)
	}
	if err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(manifest()), client.FieldOwner("gitops")); err != nil {
		t.Fatalf("the same manifest applied again: %v", err)
	}
}

// The ledger Secret re-pointed at another database during the sale: the
// operator neither seeds nor rebuilds the sale into a ledger that does not
// hold what was sold, says so in Ready (once as an event), and leaves that
// database without the campaign.
func TestLedgerSwitchedToAnotherDatabase(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("forked", 20)
	eng := e.engineFor(fs, sharedRedis.Addr())
	ctx := context.Background()
	for i := range 3 {
		res := e.reserve(eng, fmt.Sprintf("f-%d", i))
		if _, err := eng.Checkout(ctx, fmt.Sprintf("f-%d", i), res.ID, "pay"); err != nil {
			t.Fatal(err)
		}
	}
	e.waitFor("forked", settle, "sold 3", func(fs *flashsalev1alpha1.FlashSale) bool { return fs.Status.Sold == 3 })

	otherDSN, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	e.setSecret("shop-ledger", "dsn", otherDSN)
	fs = e.waitFor("forked", settle, "LedgerMismatch", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonLedgerMismatch))
	if fs.Status.Sold != 3 {
		t.Fatalf("status forgot what was sold: %+v", fs.Status)
	}
	since := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy).LastTransitionTime
	time.Sleep(3500 * time.Millisecond) // a few reconciles, in other seconds
	if c := meta.FindStatusCondition(e.get("forked").Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy); c.Status != metav1.ConditionFalse || !c.LastTransitionTime.Equal(&since) {
		t.Fatalf("LedgerHealthy %s since %s, want False since %s", c.Status, c.LastTransitionTime, since)
	}
	if n := countEvents(t, e.ns, "forked", controllers.ReasonLedgerMismatch); n != 1 {
		t.Fatalf("%d %s events, want 1", n, controllers.ReasonLedgerMismatch)
	}
	other, err := ledger.Open(ctx, otherDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.GetCampaign(ctx, string(fs.UID)); !errors.Is(err, ledger.ErrCampaignNotFound) {
		t.Fatalf("the other database got the campaign: %v", err)
	}
}

// Secrets made from files that end in a newline work: the operator strips
// trailing CR and LF from the DSN and the Redis password as the pods do.
func TestSecretsWithATrailingNewline(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.setSecret("shop-ledger", "dsn", e.dsn+"\n")
	e.startController()
	e.openSale("newline", 10)
}

// An unchanged child is never rewritten (a rewrite on every reconcile also
// fought the Deployment controller over its revision annotation), and when
// one is, labels and annotations others keep on it stay.
func TestChildrenAreNotRewrittenAndKeepOthersMetadata(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("quiet", 10)
	get := e.deployment
	time.Sleep(time.Second)
	// The Deployment controller's revision annotation (no such controller runs
	// here): a rewrite that dropped it would change the object every time.
	for _, name := range []string{"quiet-reserve", "quiet-sweeper"} {
		update(t, get(name), func(d *appsv1.Deployment) { d.Annotations["deployment.kubernetes.io/revision"] = "1" })
	}
	updates := e.deploymentUpdates.Load()
	before := map[string]string{}
	for _, name := range []string{"quiet-reserve", "quiet-sweeper"} {
		before[name] = get(name).ResourceVersion
	}
	time.Sleep(3500 * time.Millisecond) // several status refreshes
	for name, rv := range before {
		if got := get(name).ResourceVersion; got != rv {
			t.Fatalf("%s rewritten while nothing changed: resourceVersion %s → %s", name, rv, got)
		}
	}
	if n := e.deploymentUpdates.Load() - updates; n != 0 {
		t.Fatalf("%d Deployment updates sent while nothing changed", n)
	}

	update(t, get("quiet-reserve"), func(d *appsv1.Deployment) {
		d.Annotations["deployment.kubernetes.io/revision"] = "7"
		d.Labels["team"] = "checkout"
	})
	updateSpec(t, e.ns, "quiet", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Reservation.Replicas = ptr.To[int32](3) })
	testharness.Eventually(t, settle, "the reserve Deployment scaled", func() bool { return *get("quiet-reserve").Spec.Replicas == 3 })
	d := get("quiet-reserve")
	if d.Annotations["deployment.kubernetes.io/revision"] != "7" || d.Labels["team"] != "checkout" {
		t.Fatalf("others' metadata lost: annotations %v, labels %v", d.Annotations, d.Labels)
	}
}

// spec.pods reaches the pods, and so does its removal (and that of
// reservation.resources): a field the spec drops is dropped from the
// Deployment, which is then left alone; so is a field someone else adds (a
// policy engine's toleration), and a quantity the API server rounds.
func TestPodPlacementFollowsTheSpec(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	s := e.sale("placed", 10)
	s.fs.Spec.Pods = &flashsalev1alpha1.PodsSpec{
		ImagePullSecrets:  []corev1.LocalObjectReference{{Name: "registry"}},
		NodeSelector:      map[string]string{"pool": "drop"},
		Tolerations:       []corev1.Toleration{{Key: "drop", Operator: corev1.TolerationOpEqual, Value: "yes", Effect: corev1.TaintEffectNoSchedule}},
		PriorityClassName: "flash-sale",
	}
	// 100u is stored as 1m.
	s.fs.Spec.Reservation.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100u")}}
	e.apply(s)
	e.waitFor("placed", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	get := e.deployment
	for _, name := range []string{"placed-reserve", "placed-sweeper"} {
		spec := get(name).Spec.Template.Spec
		if spec.NodeSelector["pool"] != "drop" || len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "drop" ||
			len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "registry" || spec.PriorityClassName != "flash-sale" {
			t.Fatalf("%s: placement %+v", name, spec)
		}
	}
	if cpu := get("placed-reserve").Spec.Template.Spec.Containers[0].Resources.Requests.Cpu(); cpu.String() != "1m" {
		t.Fatalf("reserve cpu request %s", cpu)
	}
	untouched := func(what string) {
		t.Helper()
		before, updates := get("placed-reserve").ResourceVersion, e.deploymentUpdates.Load()
		time.Sleep(3 * time.Second) // several status refreshes
		if got := get("placed-reserve").ResourceVersion; got != before {
			t.Fatalf("%s: the reserve Deployment rewritten while nothing changed: %s → %s", what, before, got)
		}
		// An update that changes nothing stored leaves the resourceVersion.
		if n := e.deploymentUpdates.Load() - updates; n != 0 {
			t.Fatalf("%s: %d Deployment updates sent while nothing changed", what, n)
		}
	}
	untouched("placed")

	updateSpec(t, e.ns, "placed", func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Pods = nil
		fs.Spec.Reservation.Resources = nil
	})
	testharness.Eventually(t, settle, "placement and resources removed", func() bool {
		r, w := get("placed-reserve").Spec.Template.Spec, get("placed-sweeper").Spec.Template.Spec
		return r.NodeSelector == nil && r.Tolerations == nil && r.ImagePullSecrets == nil && r.PriorityClassName == "" &&
			r.Containers[0].Resources.Requests == nil && w.NodeSelector == nil && w.PriorityClassName == ""
	})
	untouched("removed")

	update(t, get("placed-reserve"), func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "policy", Operator: corev1.TolerationOpExists}}
	})
	untouched("a toleration added by someone else")
	if tol := get("placed-reserve").Spec.Template.Spec.Tolerations; len(tol) != 1 || tol[0].Key != "policy" {
		t.Fatalf("someone else's toleration: %+v", tol)
	}
}

// A placement the CRD accepts but the API server refuses in a pod (a
// nodeSelector value that is not a label value) is named in Ready, the sale
// goes on being gated, and fixing the spec clears it.
func TestPodPlacementTheAPIServerRefusesIsNamed(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("misplaced", 10)
	updateSpec(t, e.ns, "misplaced", func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Pods = &flashsalev1alpha1.PodsSpec{NodeSelector: map[string]string{"pool": "drop nodes"}}
	})
	fs := e.waitFor("misplaced", settle, "ChildrenFailed", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonChildrenFailed))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); !strings.Contains(c.Message, "nodeSelector") || !strings.Contains(c.Message, "drop nodes") {
		t.Fatalf("Ready does not name the refused field: %s", c.Message)
	}
	if fs.Status.ObservedGeneration == fs.Generation {
		t.Fatal("a spec whose pods cannot be written is reported observed")
	}
	if sel := e.deployment("misplaced-reserve").Spec.Template.Spec.NodeSelector; sel != nil {
		t.Fatalf("the reserve pods got %v", sel)
	}
	updateSpec(t, e.ns, "misplaced", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Pods = nil })
	e.waitFor("misplaced", settle, "the spec observed", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
		return c != nil && c.Reason != controllers.ReasonChildrenFailed && fs.Status.ObservedGeneration == fs.Generation
	})
}

// The scale subresource: kubectl scale (or a HorizontalPodAutoscaler) sets
// spec.reservation.replicas, the reserve Deployment follows, and the scale's
// status reports the pods and their selector.
func TestScaleSubresource(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("scaled", 10)
	kubectl(t, "scale", "flashsale", "scaled", "-n", e.ns, "--replicas=4")
	ctx := context.Background()
	testharness.Eventually(t, settle, "the reserve Deployment at 4 replicas", func() bool {
		var d appsv1.Deployment
		return k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "scaled-reserve"}, &d) == nil && *d.Spec.Replicas == 4
	})
	markReady(t, e.ns, "scaled-reserve")
	fs := e.waitFor("scaled", settle, "4 reservation replicas", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.ReservationReplicas == 4
	})
	var scale autoscalingv1.Scale
	if err := k8s.SubResource("scale").Get(ctx, fs, &scale); err != nil {
		t.Fatal(err)
	}
	sel, err := labels.Parse(scale.Status.Selector)
	if err != nil || scale.Spec.Replicas != 4 || scale.Status.Replicas != 4 ||
		!sel.Matches(labels.Set{controllers.LabelInstance: "scaled", controllers.LabelComponent: controllers.ComponentReserve,
			controllers.LabelName: "flashsale", controllers.LabelManagedBy: controllers.ManagedBy, controllers.LabelFlashSale: "scaled"}) ||
		sel.Matches(labels.Set{controllers.LabelFlashSale: "scaled", controllers.LabelComponent: controllers.ComponentSweeper}) {
		t.Fatalf("scale %+v (selector %v)", scale, err)
	}
	markReady(t, e.ns, "scaled-sweeper")
	e.waitFor("scaled", settle, "Ready", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue)
	})
	// A scale is no rollout: Ready stays True while the Deployment
	// controller (none here) has not caught up with the new replicas.
	kubectl(t, "scale", "flashsale", "scaled", "-n", e.ns, "--replicas=6")
	testharness.Eventually(t, settle, "the reserve Deployment at 6 replicas", func() bool {
		return *e.deployment("scaled-reserve").Spec.Replicas == 6
	})
	for range 10 {
		if c := meta.FindStatusCondition(e.get("scaled").Status.Conditions, flashsalev1alpha1.ConditionReady); c.Status != metav1.ConditionTrue {
			t.Fatalf("Ready after a scale: %+v", c)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Scaled to zero, nothing serves buyers: not Ready, and it says why.
	kubectl(t, "scale", "flashsale", "scaled", "-n", e.ns, "--replicas=0")
	e.waitFor("scaled", settle, "not Ready at 0 replicas", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "replicas is 0")
	})
}

// A sale whose PostgreSQL hangs (connections accepted, never answered) does
// not hold up the other sales: they are reconciled, seeded and opened while
// its connection attempt is still waiting.
func TestAStuckLedgerDoesNotHoldUpOtherSales(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	silent := testharness.StartSilentServer(t)
	e.create(e.secret("stuck-ledger", map[string]string{"dsn": "postgres://u@" + silent.Addr() + "/db?sslmode=disable&connect_timeout=60"}))
	e.startController()
	e.apply(e.sale("stuck", 10).ledgerSecret("stuck-ledger"))
	select {
	case <-silent.Accepted:
	case <-time.After(settle):
		t.Fatal("the stuck sale never tried its ledger")
	}
	e.openSale("flowing", 10)
	select {
	case <-silent.FirstClosed:
		t.Fatal("the other sale waited for the stuck sale's connection attempt to end")
	default:
	}
}

// A Redis that may evict keys: a new sale is not seeded on it, and a live
// sale whose server starts evicting is reported (RedisHealthy False, Ready
// False, one Warning) while it goes on being gated: pausing it still closes it.
func TestRedisThatMayEvict(t *testing.T) {
	srv, err := testharness.StartRedisArgs("--maxmemory", "100mb", "--maxmemory-policy", "noeviction")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	e := newEnv(t, srv.Addr(), sharedPG)
	e.startController()
	e.openSale("live", 10)

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("live", settle, "RedisEvictionPolicy", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonRedisEvictionPolicy))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy); c == nil || c.Reason != controllers.ReasonEvictionPolicy ||
		!strings.Contains(c.Message, "allkeys-lru") {
		t.Fatalf("RedisHealthy %+v", c)
	}
	if fs.Status.Phase != flashsalev1alpha1.PhaseOpen {
		t.Fatalf("phase %s: the live sale was closed", fs.Status.Phase)
	}
	updateSpec(t, e.ns, "live", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	e.waitFor("live", settle, "Paused", phaseIs(flashsalev1alpha1.PhasePaused))

	e.apply(e.sale("new", 10))
	fs = e.waitFor("new", settle, "RedisEvictionPolicy", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonRedisEvictionPolicy))
	if conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue) {
		t.Fatal("a sale seeded on a Redis that may evict its keys")
	}
	time.Sleep(2 * time.Second)
	var events corev1.EventList
	if err := k8s.List(ctx, &events, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	warned := 0
	for _, ev := range events.Items {
		if ev.Reason == controllers.ReasonRedisEvictionPolicy && ev.InvolvedObject.Name == "live" {
			n := max(1, int(ev.Count))
			if ev.Series != nil { // repeats folded by the events recorder
				n = max(n, int(ev.Series.Count))
			}
			warned += n
		}
	}
	if warned != 1 {
		t.Fatalf("%d RedisEvictionPolicy warnings for the live sale, want 1", warned)
	}
}

// A ledger query that hangs (here behind a table lock) is given up before the
// reconcile's deadline, and the status says the ledger does not answer: the
// status write has time of its own.
func TestHungLedgerQueryIsReportedBeforeTheReconcileDeadline(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	e.apply(e.sale("hung", 10))
	e.waitFor("hung", settle, "Open with the ledger healthy", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue)
	})
	// Seeded without a bound (migrations, children); bounded from here on.
	stop()
	e.reconcileTimeout = 16 * time.Second // 12 s for the phases, 4 s for the status write
	e.startController()
	timeoutsBefore := reconcileTimeouts(t)
	release := e.holdLedger("LOCK TABLE flashsale_campaigns IN ACCESS EXCLUSIVE MODE")
	e.waitFor("hung", 2*e.reconcileTimeout, "LedgerHealthy False", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse)
	})
	// The phases gave up before the reconcile's own deadline did.
	if n := reconcileTimeouts(t) - timeoutsBefore; n != 0 {
		t.Fatalf("%v reconciles ran into their deadline", n)
	}
	release()
	e.waitFor("hung", settle, "LedgerHealthy True again", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue)
	})
}

// A secretRef renamed (a kustomize secretGenerator's new suffix) to a Secret
// whose values do not connect leaves the pods on the Secret they run with:
// rolled onto the new one, they would not start. Once it connects, they roll.
func TestSecretRenamedToOneThatDoesNotConnectKeepsThePods(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("renamed", 10)
	port, err := testharness.FreePort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	dsnSecret := func(name string) string {
		t.Helper()
		for _, env := range e.deployment(name).Spec.Template.Spec.Containers[0].Env {
			if env.Name == config.EnvPostgresDSN {
				return env.ValueFrom.SecretKeyRef.Name
			}
		}
		t.Fatalf("%s reads no DSN", name)
		return ""
	}
	e.create(e.secret("shop-ledger-v2", map[string]string{"dsn": fmt.Sprintf("postgres://u@127.0.0.1:%d/db?sslmode=disable", port)}))
	updateSpec(t, e.ns, "renamed", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Postgres.SecretRef.Name = "shop-ledger-v2" })
	e.waitFor("renamed", settle, controllers.ReasonLedgerUnreachable, reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonLedgerUnreachable))
	time.Sleep(2 * time.Second) // refreshes that would roll the pods
	for _, d := range []string{"renamed-reserve", "renamed-sweeper"} {
		if got := dsnSecret(d); got != "shop-ledger" {
			t.Fatalf("%s rolled onto Secret %q, which does not connect", d, got)
		}
	}
	e.setSecret("shop-ledger-v2", "dsn", e.dsn)
	testharness.Eventually(t, settle, "the pods on the new Secret", func() bool {
		return dsnSecret("renamed-reserve") == "shop-ledger-v2" && dsnSecret("renamed-sweeper") == "shop-ledger-v2"
	})
}

// A ledger Secret whose DSN does not parse is named, and the password it
// holds is shown nowhere: pgx quotes such a DSN in its error, redacting only
// the passwords it can find.
func TestLedgerDSNThatDoesNotParse(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.setSecret("shop-ledger", "dsn", "host=127.0.0.1 user=u password = Zz9secret dbname=x sslmode=requir")
	e.startController()
	e.apply(e.sale("garbled", 10))
	fs := e.waitFor("garbled", settle, controllers.ReasonLedgerSecretInvalid, reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonLedgerSecretInvalid))
	c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
	if !strings.Contains(c.Message, `ledger Secret "shop-ledger" key "dsn"`) || !strings.Contains(c.Message, "sslmode") {
		t.Fatalf("Ready does not say what is wrong where: %s", c.Message)
	}
	if !conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse) {
		t.Fatalf("LedgerHealthy %+v", meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy))
	}
	noSecretIn(t, e.ns, fs, "Zz9secret")
	e.setSecret("shop-ledger", "dsn", e.dsn)
	e.waitFor("garbled", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
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

// A Secret is rotated to values that do not connect (a ledger DSN or Redis
// address nothing answers at): as with a Secret gone, the sale goes on being
// gated with the connections opened before (pausing it still closes it), its
// pods are not rolled onto the new values, and Ready says what is wrong.
func TestSecretRotatedToADeadServerStillPauses(t *testing.T) {
	for _, tc := range []struct {
		name, secret, key, reason string
		dead                      func(port int) string
		alive                     func(e *env) string
	}{
		{"ledger", "shop-ledger", "dsn", controllers.ReasonLedgerUnreachable,
			func(port int) string { return fmt.Sprintf("postgres://u@127.0.0.1:%d/db?sslmode=disable", port) },
			func(e *env) string { return e.dsn }},
		{"redis", "shop-redis", "addresses", controllers.ReasonRedisUnreachable,
			func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) },
			func(e *env) string { return e.redisAddr }},
		{"ledger DSN that does not parse", "shop-ledger", "dsn", controllers.ReasonLedgerSecretInvalid,
			func(port int) string {
				return fmt.Sprintf("host=127.0.0.1 port=%d password = Zz9secret sslmode=requir", port)
			},
			func(e *env) string { return e.dsn }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, sharedRedis.Addr(), sharedPG)
			e.startController()
			fs := e.openSale("rotated", 10)
			eng := e.engineFor(fs, sharedRedis.Addr())
			port, err := testharness.FreePort() // nothing listens there
			if err != nil {
				t.Fatal(err)
			}
			fingerprint := func() string {
				return e.deployment("rotated-reserve").Spec.Template.Annotations[controllers.AnnotationSecrets]
			}
			before := fingerprint()
			e.setSecret(tc.secret, tc.key, tc.dead(port))
			fs = e.waitFor("rotated", settle, tc.reason, reasonIs(flashsalev1alpha1.ConditionReady, tc.reason))
			if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); !strings.Contains(c.Message, "still served and gated") ||
				!strings.Contains(c.Message, fmt.Sprintf("Secret %q", tc.secret)) {
				t.Fatalf("Ready %+v", c)
			}
			// The connections in use are fine, and the status says so.
			for _, c := range []string{flashsalev1alpha1.ConditionLedgerHealthy, flashsalev1alpha1.ConditionRedisHealthy, flashsalev1alpha1.ConditionAdmitting} {
				if !conditionIs(fs, c, metav1.ConditionTrue) {
					t.Errorf("%s: %+v", c, meta.FindStatusCondition(fs.Status.Conditions, c))
				}
			}
			noSecretIn(t, e.ns, fs, "Zz9secret")
			updateSpec(t, e.ns, "rotated", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
			e.waitFor("rotated", settle, "Paused", phaseIs(flashsalev1alpha1.PhasePaused))
			if r, err := eng.Reserve(context.Background(), "late-buyer", "r", 1); err != nil || r.Reason != stock.StatePaused {
				t.Fatalf("reserve while paused: %+v %v", r, err)
			}
			// The pods are not rolled onto values the operator could not connect with.
			if got := fingerprint(); got != before {
				t.Fatalf("the reserve pods were rolled onto the dead server: fingerprint %q → %q", before, got)
			}
			e.setSecret(tc.secret, tc.key, tc.alive(e))
			e.waitFor("rotated", settle, "Ready no longer "+tc.reason, func(fs *flashsalev1alpha1.FlashSale) bool {
				c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
				return c != nil && c.Reason != tc.reason
			})
		})
	}
}
