package chart

import (
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// metricSources are the packages that define the project's metrics.
var metricSources = []string{"controllers", "internal/cmd/manager", "runtime/api", "runtime/sweeper"}

var metricName = regexp.MustCompile(`flashsale_[a-z0-9_]+`)

// emittedMetrics reads every metric name the code defines: the string
// literals of the metric packages' source that are a whole metric name.
func emittedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, dir := range metricSources {
		for _, f := range testharness.ParseGoFiles(t, filepath.Join(testharness.RepoRoot(), dir)) {
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				if s, err := strconv.Unquote(lit.Value); err == nil && s != "" && metricName.FindString(s) == s {
					out[s] = true
				}
				return true
			})
		}
	}
	if len(out) == 0 {
		t.Fatal("no metric name found in the metric packages' source")
	}
	return out
}

// seriesName is the metric a PromQL series name belongs to: a histogram's
// series carry a suffix.
func seriesName(s string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if m, ok := strings.CutSuffix(s, suffix); ok {
			return m
		}
	}
	return s
}

// TestQueriesUseEmittedMetrics: every metric the chart's alerts and
// dashboard query is one the code emits, so a renamed metric cannot leave an
// alert that never fires or a panel that stays empty.
func TestQueriesUseEmittedMetrics(t *testing.T) {
	emitted := emittedMetrics(t)
	check := func(where, expr string) {
		for _, s := range metricName.FindAllString(expr, -1) {
			if !emitted[seriesName(s)] && !emitted[s] {
				t.Errorf("%s queries %s, which no metric package defines", where, s)
			}
		}
	}
	objs := render(t, "monitoring.prometheusRule.enabled=true")
	rule := find(t, objs, "PrometheusRule", "flashsale-operator")
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	exprs := 0
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			name, _, _ := unstructured.NestedString(r.(map[string]any), "alert")
			expr, _, _ := unstructured.NestedString(r.(map[string]any), "expr")
			check("alert "+name, expr)
			exprs++
		}
	}
	dashboards, err := filepath.Glob(filepath.Join(testharness.RepoRoot(), "charts", "flashsale-operator", "files", "dashboards", "*.json"))
	if err != nil || len(dashboards) == 0 {
		t.Fatalf("no dashboard found: %v", err)
	}
	for _, path := range dashboards {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		check(filepath.Base(path), string(b))
	}
	if exprs == 0 {
		t.Fatal("the rendered PrometheusRule has no rule")
	}
}

// TestEveryMetricIsDocumented: the metric tables and lists of docs/metrics.md
// and docs/operations.md name every metric the code emits.
func TestEveryMetricIsDocumented(t *testing.T) {
	emitted := emittedMetrics(t)
	documented := map[string]bool{}
	for _, page := range []string{"metrics.md", "operations.md"} {
		b, err := os.ReadFile(filepath.Join(testharness.RepoRoot(), "docs", page))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range metricName.FindAllString(string(b), -1) {
			documented[seriesName(s)] = true
		}
	}
	var missing []string
	for m := range emitted {
		if !documented[m] {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("metrics no page documents (docs/metrics.md, docs/operations.md): %v", missing)
	}
}
