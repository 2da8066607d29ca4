package controllers_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/failpoint"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A child the controller cannot write (here a Deployment of the same name that
// is not the sale's) is named in Ready, and the sale is still gated and
// observed on time: the schedule's end closes it.
func TestChildThatCannotBeWrittenDoesNotStallTheSale(t *testing.T) {
	t.Parallel()
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

// An unchanged child is never rewritten (a rewrite on every reconcile also
// fought the Deployment controller over its revision annotation), and when
// one is, labels and annotations others keep on it stay.
func TestChildrenAreNotRewrittenAndKeepOthersMetadata(t *testing.T) {
	t.Parallel()
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

// Labels someone adds to the reserve pods' template (a mesh's injection
// label, a NetworkPolicy's selector label) and the annotation of kubectl
// rollout restart survive the operator's next rewrite of the Deployment for a
// change of its own (without it, that rewrite would roll the pods back to
// before the restart's moment), and the operator's own labels keep its values.
func TestPodTemplateLabelsOthersAddSurviveARewrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("labelled", 10)
	others := map[string]string{"sidecar.istio.io/inject": "true", "netpol.example.com/ledger-client": "allow"}
	const restartedAt = "kubectl.kubernetes.io/restartedAt"
	restarted := time.Now().UTC().Format(time.RFC3339)
	update(t, e.deployment("labelled-reserve"), func(d *appsv1.Deployment) {
		maps.Copy(d.Spec.Template.Labels, others)
		if d.Spec.Template.Annotations == nil {
			d.Spec.Template.Annotations = map[string]string{}
		}
		d.Spec.Template.Annotations[restartedAt] = restarted
	})
	// A change of the operator's own: the TTL, an env var of the pods.
	updateSpec(t, e.ns, "labelled", func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Reservation.TTL = &metav1.Duration{Duration: 2 * time.Minute}
	})
	testharness.Eventually(t, settle, "the new TTL in the pod template", func() bool {
		return slices.Contains(envOf(e.deployment("labelled-reserve")), config.EnvTTL+"=2m0s")
	})
	tmpl := e.deployment("labelled-reserve").Spec.Template
	if tmpl.Annotations[restartedAt] != restarted {
		t.Errorf("kubectl rollout restart's annotation lost in the operator's rewrite: %v", tmpl.Annotations)
	}
	got := tmpl.Labels
	for k, v := range others {
		if got[k] != v {
			t.Errorf("pod template label %s=%s lost in the operator's rewrite: %v", k, v, got)
		}
	}
	ours := map[string]string{controllers.LabelName: "flashsale", controllers.LabelInstance: "labelled",
		controllers.LabelComponent: controllers.ComponentReserve, controllers.LabelManagedBy: controllers.ManagedBy,
		controllers.LabelFlashSale: "labelled"}
	for k, v := range ours {
		if got[k] != v {
			t.Errorf("the operator's pod template label %s is %q, not %q", k, got[k], v)
		}
	}
}

// envOf is the first container's environment as NAME=value.
func envOf(d *appsv1.Deployment) []string {
	var out []string
	for _, v := range d.Spec.Template.Spec.Containers[0].Env {
		out = append(out, v.Name+"="+v.Value)
	}
	return out
}

// The pod contract's variables (FLASHSALE_*) are the operator's: one added to
// a Deployment by hand, which would override the operator's value (the last
// of a name wins), is removed; one changed is put back. Before, the change
// check took a longer env list as the API server's defaults and left both.
// A variable of someone else's is left alone, and so are a container someone
// else adds and the failpoint test hook, which the node tests set on a
// sweeper Deployment by hand.
func TestPodContractVariablesAddedByHandArePutBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("owned", 10)
	get := e.deployment
	contract := func(d *appsv1.Deployment) []string {
		var out []string
		for _, v := range d.Spec.Template.Spec.Containers[0].Env {
			if strings.HasPrefix(v.Name, config.EnvPrefix) {
				out = append(out, v.Name+"="+v.Value)
			}
		}
		return out
	}
	want := contract(get("owned-reserve"))
	update(t, get("owned-reserve"), func(d *appsv1.Deployment) {
		c := &d.Spec.Template.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: config.EnvRateLimit, Value: "1"}, corev1.EnvVar{Name: "HTTP_PROXY", Value: "http://proxy:3128"})
	})
	testharness.Eventually(t, settle, "the hand-added FLASHSALE_ variable removed", func() bool {
		return slices.Equal(contract(get("owned-reserve")), want)
	})
	update(t, get("owned-reserve"), func(d *appsv1.Deployment) {
		c := &d.Spec.Template.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: "HTTP_PROXY", Value: "http://proxy:3128"},
			corev1.EnvVar{Name: failpoint.Env, Value: failpoint.SweepAfterLedgerCancel})
		d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, corev1.Container{Name: "log-shipper", Image: "log-shipper:1"})
	})
	rv := get("owned-reserve").ResourceVersion
	time.Sleep(2500 * time.Millisecond) // a status refresh or more
	if got := get("owned-reserve").ResourceVersion; got != rv {
		t.Fatalf("rewritten for someone else's variable or container: resourceVersion %s → %s", rv, got)
	}
}

// spec.pods reaches the pods, and so does its removal (and that of
// reservation.resources): a field the spec drops is dropped from the
// Deployment, which is then left alone; so is a field someone else adds (a
// policy engine's toleration), and a quantity the API server rounds.
func TestPodPlacementFollowsTheSpec(t *testing.T) {
	t.Parallel()
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
			r.Containers[0].Resources.Requests.Cpu().String() == controllers.DefaultReserveCPURequest &&
			w.NodeSelector == nil && w.PriorityClassName == ""
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
	t.Parallel()
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
	t.Parallel()
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
	// Scaled to zero, nothing serves buyers: not Ready nor Admitting, and
	// they say why.
	kubectl(t, "scale", "flashsale", "scaled", "-n", e.ns, "--replicas=0")
	e.waitFor("scaled", settle, "neither Ready nor Admitting at 0 replicas", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
		a := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionAdmitting)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "replicas is 0") &&
			a != nil && a.Status == metav1.ConditionFalse && a.Reason == controllers.ReasonChildrenNotReady
	})
}

// An autoscaler pointed at the reserve Deployment instead of the FlashSale
// fights the operator, which puts the replicas back from the spec: the
// operator says so in a Warning that names the other writer and what to
// point it at, instead of reverting in silence.
func TestReplicasSetOnTheDeploymentAreNamed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("fought", 10)
	ctx := context.Background()
	d := e.deployment("fought-reserve")
	want := *d.Spec.Replicas
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: want + 3}}
	if err := k8s.SubResource("scale").Update(ctx, d, client.WithSubResourceBody(scale),
		&client.SubResourceUpdateOptions{UpdateOptions: client.UpdateOptions{FieldManager: "test-autoscaler"}}); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, settle, "the replicas put back from the spec", func() bool {
		return *e.deployment("fought-reserve").Spec.Replicas == want
	})
	if !hasEventSaying(t, e.ns, "fought", controllers.ReasonReplicasOverridden, "test-autoscaler (through the scale subresource) set Deployment fought-reserve") {
		t.Fatal("no ReplicasOverridden event naming test-autoscaler")
	}
	// The sweeper's replicas are not the spec's to scale: the advice says so.
	sweeper := e.deployment("fought-sweeper")
	if err := k8s.SubResource("scale").Update(ctx, sweeper, client.WithSubResourceBody(&autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 7}}),
		&client.SubResourceUpdateOptions{UpdateOptions: client.UpdateOptions{FieldManager: "test-autoscaler"}}); err != nil {
		t.Fatal(err)
	}
	if !hasEventSaying(t, e.ns, "fought", controllers.ReasonReplicasOverridden, "fought-sweeper to 7 replicas; the operator puts back 2: the sweeper's replicas are fixed") {
		t.Fatal("no ReplicasOverridden event for the sweeper with its own advice")
	}
	// The operator's own change of the replicas (the spec's) is no override.
	kubectl(t, "scale", "flashsale", "fought", "-n", e.ns, "--replicas=5")
	testharness.Eventually(t, settle, "the reserve Deployment at 5 replicas", func() bool {
		return *e.deployment("fought-reserve").Spec.Replicas == 5
	})
	var list corev1.EventList
	if err := k8s.List(ctx, &list, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range list.Items {
		if ev.Reason == controllers.ReasonReplicasOverridden && !strings.Contains(ev.Message, "test-autoscaler") {
			t.Errorf("an override named when the spec changed: %s", ev.Message)
		}
	}
}
