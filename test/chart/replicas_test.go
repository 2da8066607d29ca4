package chart

import (
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestReplicasAreSpreadAndDrainedOneAtATime: one manager needs neither; more
// get a PodDisruptionBudget over their own pods that lets a drain evict one
// at a time, and a preference for different nodes, unless the values give
// an affinity of their own or turn the budget off.
func TestReplicasAreSpreadAndDrainedOneAtATime(t *testing.T) {
	if objs := render(t); kinds(objs)["PodDisruptionBudget"] != 0 {
		t.Error("a PodDisruptionBudget for one replica: a drain would wait on it for good")
	}
	if d, _ := manager(t, render(t)); d.Spec.Template.Spec.Affinity != nil {
		t.Errorf("one replica with an affinity: %+v", d.Spec.Template.Spec.Affinity)
	}

	objs := render(t, "replicaCount=2")
	d, _ := manager(t, objs)
	pdb := as[policyv1.PodDisruptionBudget](t, find(t, objs, "PodDisruptionBudget", ""))
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("budget: %+v, want maxUnavailable 1", pdb.Spec)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("budget selector %v (%v) does not select the manager's pods %v", pdb.Spec.Selector, err, d.Spec.Template.Labels)
	}
	a := d.Spec.Template.Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("two replicas: affinity %+v, want a preferred anti-affinity", a)
	}
	term := a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
	if term.TopologyKey != "kubernetes.io/hostname" || !labelsMatch(t, term.LabelSelector, d.Spec.Template.Labels) {
		t.Errorf("anti-affinity term %+v", term)
	}

	if kinds(render(t, "replicaCount=2", "podDisruptionBudget.enabled=false"))["PodDisruptionBudget"] != 0 {
		t.Error("a PodDisruptionBudget with podDisruptionBudget.enabled=false")
	}
	d, _ = manager(t, render(t, "replicaCount=2", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists"))
	if a := d.Spec.Template.Spec.Affinity; a == nil || a.NodeAffinity == nil || a.PodAntiAffinity != nil {
		t.Errorf("the values' affinity: %+v, want it alone", a)
	}
}

func labelsMatch(t *testing.T, ls *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(ls)
	return err == nil && !sel.Empty() && sel.Matches(labels.Set(podLabels))
}
