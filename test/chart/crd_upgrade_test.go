package chart

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// crdUpgrade is the command the docs give for the CRD before `helm upgrade`.
const crdUpgrade = "kubectl apply --server-side --force-conflicts -f "

// Helm creates a chart's crds/ on the first install, under its own field
// manager, and never updates them. The upgrade the docs give, a server-side
// apply of the chart's crds/ with --force-conflicts, takes the CRD over from
// Helm; without --force-conflicts the API server refuses it, as every
// version's schema is a field Helm set.
func TestCRDUpgradeOverHelmsInstall(t *testing.T) {
	e := startApplyEnv(t)
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join(chartDir, "crds", "flashsale.dev_flashsales.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// In a group of its own: the API server already serves the CRD itself.
	const group = "upgrade.flashsale.dev"
	current := &unstructured.Unstructured{}
	if err := utilyaml.Unmarshal(raw, &current.Object); err != nil {
		t.Fatal(err)
	}
	current.SetName("flashsales." + group)
	if err := unstructured.SetNestedField(current.Object, group, "spec", "group"); err != nil {
		t.Fatal(err)
	}
	// The release before: the same CRD with an older schema.
	installed := &apiextensionsv1.CustomResourceDefinition{}
	if err := utilyaml.Unmarshal(raw, installed); err != nil {
		t.Fatal(err)
	}
	installed.Name, installed.Spec.Group = "flashsales."+group, group
	installed.Spec.Versions[0].Schema.OpenAPIV3Schema.Description = "the release before"
	if err := e.c.Create(ctx, installed, client.FieldOwner("helm")); err != nil {
		t.Fatal(err)
	}

	apply := func(opts ...client.ApplyOption) error {
		return e.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(current.DeepCopy()), append(opts, client.FieldOwner("kubectl"))...)
	}
	if err := apply(); !apierrors.IsConflict(err) {
		t.Fatalf("a server-side apply over Helm's CRD without --force-conflicts: %v, want a conflict", err)
	}
	if err := apply(client.ForceOwnership); err != nil {
		t.Fatalf("with --force-conflicts: %v", err)
	}
	got := &apiextensionsv1.CustomResourceDefinition{}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(installed), got); err != nil {
		t.Fatal(err)
	}
	if d := got.Spec.Versions[0].Schema.OpenAPIV3Schema.Description; d == "the release before" {
		t.Fatal("the apply left the release before's schema")
	}

	for _, doc := range []string{"docs/upgrades.md", "charts/flashsale-operator/templates/NOTES.txt", "CHANGELOG.md"} {
		b, err := os.ReadFile(filepath.Join(testharness.RepoRoot(), doc))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(string(b)), " ")
		if !strings.Contains(text, crdUpgrade) {
			t.Errorf("%s does not give the CRD upgrade as %q", doc, crdUpgrade)
		}
		if strings.Contains(text, "kubectl apply --server-side -f charts/flashsale-operator/crds") || strings.Contains(text, "kubectl apply --server-side -f <chart>/crds") {
			t.Errorf("%s gives the CRD upgrade without --force-conflicts, which Helm's field ownership refuses", doc)
		}
	}
}
