package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

func TestCreateSeedsDeploysAndReports(t *testing.T) {
	t.Parallel()
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

func TestScheduleGatesAndLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	// An hour ahead at first, so a slow first reconcile still sees a
	// scheduled sale; then moved to a few seconds from now, as a pipeline
	// that brings a drop forward does.
	e.apply(e.sale("scheduled", 50).schedule(time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)))
	fs := e.waitFor("scheduled", settle, "Scheduled", phaseIs(flashsalev1alpha1.PhaseScheduled))
	// kubectl describe says until when, kubectl get -o wide shows the schedule.
	opens := fs.Spec.Schedule.Start.UTC().Format(time.RFC3339)
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionAdmitting); c == nil || !strings.Contains(c.Message, opens) {
		t.Fatalf("Admitting while scheduled: %+v, want the start %s", c, opens)
	}
	if out := kubectl(t, "get", "fs", "scheduled", "-n", e.ns, "-o", "wide"); !strings.Contains(out, "START") || !strings.Contains(out, opens) {
		t.Fatalf("kubectl get -o wide lacks the start %s:\n%s", opens, out)
	}
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
	// Long enough to reserve in after an open that is late on a busy machine.
	end := start.Add(8 * time.Second)
	updateSpec(t, e.ns, "scheduled", func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Schedule.Start, fs.Spec.Schedule.End = &metav1.Time{Time: start}, &metav1.Time{Time: end}
	})
	if r, err := eng.Reserve(context.Background(), "early", "r2", 1); err != nil || r.Outcome != "CLOSED" || r.Reason != stock.StateNotStarted {
		t.Fatalf("before the start brought forward: %+v %v", r, err)
	}
	e.waitFor("scheduled", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	// Woken at the start: without that, the next look is the scheduled
	// sale's refresh (10 s after the update, so 6 s or more late).
	if late := time.Since(start); late > 4*time.Second {
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
	// The start brought forward and the end the clock reached are no
	// schedule moved past now.
	for _, reason := range []string{controllers.ReasonStartMovedLater, controllers.ReasonEndMovedEarlier} {
		if n := countEvents(t, e.ns, "scheduled", reason); n != 0 {
			t.Fatalf("%d %s events", n, reason)
		}
	}
}

func TestPauseRestockAndDecrease(t *testing.T) {
	t.Parallel()
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

// A reconcile held up by a slow ledger across the schedule's end gates the
// shards by the time it reaches them, not by the time it began. The refresh is
// a minute here, so only that reconcile can end the sale within the test.
func TestSlowReconcileAcrossTheScheduleEnd(t *testing.T) {
	t.Parallel()
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

// A sale that has not started is refreshed every 10 s, not at the live
// refresh: a GitOps pipeline may hold many drops scheduled days ahead.
func TestScheduledSaleIsRefreshedSlowly(t *testing.T) {
	t.Parallel()
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

// The finalizer is added without writing the spec back: the stored spec stays
// as the manifest wrote it ("10m", a start with an offset), its generation
// stays 1, and a GitOps tool applying the same manifest server-side finds no
// field the controller took over.
func TestFinalizerLeavesTheSpecAsWritten(t *testing.T) {
	t.Parallel()
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
