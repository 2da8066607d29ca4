package testharness

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// ScopedManagerRules are the manager's generated rules (config/rbac/role.yaml)
// as the chart splits them for watchNamespaces: those of a Role in each
// watched namespace, and those of the ClusterRole that outlives a namespace's
// deletion (the FlashSales, and the watched Namespaces by name). The metrics
// rules, which the chart grants apart, are in neither.
func ScopedManagerRules(t testing.TB, namespaces ...string) (inNamespace, clusterWide []rbacv1.PolicyRule) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var generated rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &generated); err != nil {
		t.Fatal(err)
	}
	// As charts/flashsale-operator/templates/_helpers.tpl splits them.
	for _, r := range generated.Rules {
		switch {
		case slices.Equal(r.Resources, []string{"namespaces"}):
			r.ResourceNames = namespaces
			clusterWide = append(clusterWide, r)
		case slices.Equal(r.APIGroups, []string{"flashsale.dev"}) && slices.Equal(r.Resources, []string{"flashsales"}):
			clusterWide = append(clusterWide, r)
			inNamespace = append(inNamespace, r)
		case slices.Contains(r.APIGroups, "authentication.k8s.io") || slices.Contains(r.APIGroups, "authorization.k8s.io"):
		default:
			inNamespace = append(inNamespace, r)
		}
	}
	return inNamespace, clusterWide
}
