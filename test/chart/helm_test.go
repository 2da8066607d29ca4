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

// Package chart tests what the project ships for installing the operator:
// the Helm chart in charts/flashsale-operator (helm lint, rendered values, a
// server-side dry-run apply on a real API server), dist/install.yaml, and
// the chart's PrometheusRule (promtool).
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// chartDir is the chart under test.
var chartDir = filepath.Join(testharness.RepoRoot(), "charts", "flashsale-operator")

// kubeVersion is what helm renders for: the envtest API server's version.
const kubeVersion = "1.37.2"

var tools sync.Map // name -> result of hack/build-tool.sh

type toolResult struct {
	once sync.Once
	path string
	err  error
}

// tool is the path of one of the tools hack/build-tool.sh builds from its Go
// module and caches (helm, promtool); the first call may build it.
func tool(t testing.TB, name string) string {
	t.Helper()
	v, _ := tools.LoadOrStore(name, &toolResult{})
	r := v.(*toolResult)
	r.once.Do(func() {
		var stderr bytes.Buffer
		cmd := exec.Command("bash", filepath.Join(testharness.RepoRoot(), "hack", "build-tool.sh"), name)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			r.err = fmt.Errorf("hack/build-tool.sh %s: %w\n%s", name, err, stderr.String())
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		r.path = lines[len(lines)-1]
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.path
}

// run runs a tool and returns its standard output, or the error with its
// standard error.
func run(t testing.TB, bin string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// helm keeps its caches and repositories under $HOME; a test's own.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// template renders the chart as release "fs" in namespace flashsale-system
// with the given --set values, CRDs included.
func template(t testing.TB, set ...string) (string, error) {
	t.Helper()
	args := []string{"template", "fs", chartDir, "--namespace", "flashsale-system", "--kube-version", kubeVersion, "--include-crds"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return run(t, tool(t, "helm"), args...)
}

// render is template that must succeed, decoded into objects.
func render(t testing.TB, set ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := template(t, set...)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, out)
}

// decode splits a multi-document YAML stream into objects.
func decode(t testing.TB, manifests string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	for {
		var m map[string]any
		err := d.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decoding the manifests: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// appVersion is the chart's appVersion, the default image tag.
func appVersion(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil || c.AppVersion == "" {
		t.Fatalf("Chart.yaml has no appVersion (%v)", err)
	}
	return c.AppVersion
}

func TestMain(m *testing.M) { testharness.Main(m, func() error { return nil }) }

func TestHelmLint(t *testing.T) {
	for _, set := range [][]string{
		nil,
		{"watchNamespaces={shop,outlet}", "replicaCount=2"},
		{"monitoring.serviceMonitor.enabled=true", "monitoring.podMonitors.enabled=true",
			"monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true", "metrics.secure=false"},
	} {
		args := []string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := run(t, tool(t, "helm"), args...)
		if err != nil {
			t.Fatalf("values %v: %v\n%s", set, err, out)
		}
		// --strict fails on warnings; the one INFO left is the missing icon.
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "[WARNING]") || strings.HasPrefix(line, "[ERROR]") {
				t.Errorf("values %v: %s", set, line)
			}
		}
	}
}
