/*
Copyright 2026 The flashsale-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// writeRules renders the chart's PrometheusRule, with its ServiceMonitor
// (the install the rules' tests stand for), and writes its spec, a
// Prometheus rule file, into dir as rules.yaml.
func writeRules(t *testing.T, dir string, set ...string) string {
	t.Helper()
	objs := render(t, append([]string{"monitoring.prometheusRule.enabled=true", "monitoring.serviceMonitor.enabled=true"}, set...)...)
	rule := find(t, objs, "PrometheusRule", "flashsale-operator")
	b, err := yaml.Marshal(rule.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPrometheusRuleChecks: promtool accepts the rendered rules, and its
// unit tests (testdata/rules_test.yaml) fire every alert when it should, and
// not before or after (each test says which alerts it evaluates).
func TestPrometheusRuleChecks(t *testing.T) {
	promtool := tool(t, "promtool")
	dir := t.TempDir()
	rules := writeRules(t, dir)
	if out, err := run(t, promtool, "check", "rules", rules); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join("testdata", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, promtool, "test", "rules", filepath.Join(dir, "rules_test.yaml")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestPrometheusRuleTestsCanFail: the same unit tests fail against rules
// whose FailClosed alert waits longer, so a passing run means something.
func TestPrometheusRuleTestsCanFail(t *testing.T) {
	promtool := tool(t, "promtool")
	dir := t.TempDir()
	rules := writeRules(t, dir)
	b, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	slow := strings.Replace(string(b), "for: 1m", "for: 10m", 1)
	if slow == string(b) {
		t.Fatal("the rendered rules have no `for: 1m` to change")
	}
	if err := os.WriteFile(rules, []byte(slow), 0o644); err != nil {
		t.Fatal(err)
	}
	tests, _ := os.ReadFile(filepath.Join("testdata", "rules_test.yaml"))
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, promtool, "test", "rules", filepath.Join(dir, "rules_test.yaml"))
	if err == nil || !strings.Contains(err.Error(), "FlashSaleFailClosed") {
		t.Fatalf("promtool test rules passed against a FailClosed alert that waits 10m: %v\n%s", err, out)
	}
}

// TestEveryAlertHasARunbook: each alert's runbook_url points into
// docs/runbooks.md at a section that exists there, and each alert section
// there is an alert's.
func TestEveryAlertHasARunbook(t *testing.T) {
	objs := render(t, "monitoring.prometheusRule.enabled=true")
	rule := find(t, objs, "PrometheusRule", "flashsale-operator")
	doc, err := os.ReadFile(filepath.Join(testharness.RepoRoot(), "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := markdownAnchors(string(doc))
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	alerts, names := 0, map[string]bool{}
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			name, _, _ := unstructured.NestedString(r.(map[string]any), "alert")
			if name == "" {
				continue
			}
			alerts++
			names[name] = true
			url, _, _ := unstructured.NestedString(r.(map[string]any), "annotations", "runbook_url")
			page, anchor, ok := strings.Cut(url, "#")
			switch {
			case !ok || !strings.HasSuffix(page, "/docs/runbooks.md"):
				t.Errorf("alert %s: runbook_url %q does not point into docs/runbooks.md", name, url)
			case !sections[anchor]:
				t.Errorf("alert %s: docs/runbooks.md has no section #%s", name, anchor)
			case anchor != strings.ToLower(name):
				t.Errorf("alert %s: runbook_url anchor #%s is another alert's", name, anchor)
			}
		}
	}
	if alerts == 0 {
		t.Fatal("the rendered PrometheusRule has no alert")
	}
	// And the other way: every alert section of the runbooks names an alert
	// of the rule, so a removed alert leaves no runbook behind.
	for _, line := range strings.Split(string(doc), "\n") {
		if name, ok := strings.CutPrefix(line, "### FlashSale"); ok && !names["FlashSale"+name] {
			t.Errorf("docs/runbooks.md has a section for FlashSale%s, which the PrometheusRule does not define", name)
		}
	}
}

// markdownAnchors are the anchors GitHub gives a page's headings.
func markdownAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out
}
