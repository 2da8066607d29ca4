package controllers_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

const mirror = "mirror.example.com/"

// An admission policy that replaces a value the operator sets (here it
// prefixes the image with a registry mirror, as a Kyverno policy or a
// webhook would) makes the operator's writes of an unchanged Deployment
// no-ops: they are not sent again at every reconcile, where each would call
// the admission chain, and a webhook that fails would turn a healthy sale
// ChildrenFailed. A hand edit is still put back, and a spec change written.
func TestChildRewrittenByAdmissionIsNotWrittenAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	mirrorImages(t, e)
	e.startController()
	e.openSale("mirrored", 10)
	get := e.deployment
	if img := get("mirrored-reserve").Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, mirror) {
		t.Fatalf("the policy did not rewrite the image: %s", img)
	}
	// One write may still come, the one that finds the rewrite a no-op.
	idle := func(what string) {
		t.Helper()
		time.Sleep(time.Second)
		updates := e.deploymentUpdates.Load()
		time.Sleep(5 * time.Second) // five status refreshes
		n := e.deploymentUpdates.Load() - updates
		if n > 1 {
			t.Fatalf("%s: %d Deployment updates sent in 5 s while nothing changed but the policy's image rewrite", what, n)
		}
		t.Logf("%s: %d Deployment updates in 5 s", what, n)
	}
	idle("open")

	// The Deployment controller writes the status as pods come and go: a new
	// resourceVersion each time, and nothing of the operator's changed.
	updates := e.deploymentUpdates.Load()
	for i := range 5 {
		d := get("mirrored-reserve")
		d.Status.ObservedGeneration = d.Generation
		d.Status.Replicas = *d.Spec.Replicas
		d.Status.ReadyReplicas = *d.Spec.Replicas - int32(i%2)
		if err := k8s.Status().Update(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	if n := e.deploymentUpdates.Load() - updates; n > 1 {
		t.Fatalf("%d Deployment updates sent for 5 status changes of the Deployment's own", n)
	}

	update(t, get("mirrored-reserve"), func(d *appsv1.Deployment) {
		for i, v := range d.Spec.Template.Spec.Containers[0].Env {
			if v.Name == config.EnvTTL {
				d.Spec.Template.Spec.Containers[0].Env[i].Value = "5m0s"
			}
		}
	})
	testharness.Eventually(t, settle, "the hand-edited TTL put back", func() bool {
		return slices.Contains(envOf(get("mirrored-reserve")), config.EnvTTL+"=1m0s")
	})
	if img := get("mirrored-reserve").Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, mirror) {
		t.Fatalf("the policy did not rewrite the image again: %s", img)
	}
	idle("after the hand edit")

	// A change of the spec is written too.
	updateSpec(t, e.ns, "mirrored", func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Reservation.TTL = &metav1.Duration{Duration: 2 * time.Minute}
	})
	testharness.Eventually(t, settle, "the new TTL in the pod template", func() bool {
		return slices.Contains(envOf(get("mirrored-reserve")), config.EnvTTL+"=2m0s")
	})
}

// mirrorImages makes a MutatingAdmissionPolicy that prefixes the first
// container's image of every Deployment of the test's namespace with
// mirror, on create and update, and waits until it is in force.
func mirrorImages(t *testing.T, e *env) {
	t.Helper()
	ctx := context.Background()
	policy := &admissionv1.MutatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "mirror-" + e.ns},
		Spec: admissionv1.MutatingAdmissionPolicySpec{
			FailurePolicy:      ptr.To(admissionv1.Fail),
			ReinvocationPolicy: admissionv1.NeverReinvocationPolicy,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments"}},
				},
			}}},
			MatchConditions: []admissionv1.MatchCondition{{Name: "not-mirrored",
				Expression: `!object.spec.template.spec.containers[0].image.startsWith("` + mirror + `")`}},
			Mutations: []admissionv1.Mutation{{PatchType: admissionv1.PatchTypeJSONPatch, JSONPatch: &admissionv1.JSONPatch{
				Expression: `[JSONPatch{op: "replace", path: "/spec/template/spec/containers/0/image",
					value: "` + mirror + `" + object.spec.template.spec.containers[0].image}]`,
			}}},
		},
	}
	binding := &admissionv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionv1.MutatingAdmissionPolicyBindingSpec{PolicyName: policy.Name, MatchResources: &admissionv1.MatchResources{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": e.ns}},
		}},
	}
	for _, o := range []client.Object{policy, binding} {
		e.create(o)
		t.Cleanup(func() { _ = k8s.Delete(ctx, o) })
	}
	testharness.Eventually(t, settle, "the policy in force", func() bool {
		d := e.foreignDeployment("probe")
		if err := k8s.Create(ctx, d, client.DryRunAll); err != nil {
			t.Fatal(err)
		}
		return strings.HasPrefix(d.Spec.Template.Spec.Containers[0].Image, mirror)
	})
}
