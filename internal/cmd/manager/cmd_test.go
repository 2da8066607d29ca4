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

package manager

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := testharness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

// TestRunServesProbesAndStopsOnCancel starts the manager against a real API
// server, waits for its probes and metrics, then cancels its context as
// SIGTERM does and expects a clean return.
func TestRunServesProbesAndStopsOnCancel(t *testing.T) {
	kube := testharness.KubeT(t)
	opts := DefaultOptions()
	opts.HealthProbeBindAddress = freeAddr(t)
	opts.MetricsBindAddress = freeAddr(t)
	opts.Namespaces = []string{"shop", " ", "outlet"}
	cfg := kube.Config

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, opts) }()

	for _, url := range []string{
		"http://" + opts.HealthProbeBindAddress + "/healthz",
		"http://" + opts.HealthProbeBindAddress + "/readyz",
		"http://" + opts.MetricsBindAddress + "/metrics",
	} {
		if err := waitOK(url, done); err != nil {
			t.Fatal(err)
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v after cancel, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of cancel")
	}
	if _, err := http.Get("http://" + opts.HealthProbeBindAddress + "/healthz"); err == nil {
		t.Error("the probe server still answers after Run returned")
	}
}

func waitOK(url string, done <-chan error) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return fmt.Errorf("Run returned early: %v", err)
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer 200 within 20s", url)
}

func TestSchemeKnowsFlashSale(t *testing.T) {
	gvks, _, err := NewScheme().ObjectKinds(&flashsalev1alpha1.FlashSale{})
	if err != nil || len(gvks) != 1 || gvks[0] != flashsalev1alpha1.GroupVersion.WithKind("FlashSale") {
		t.Fatalf("scheme kinds %v, err %v", gvks, err)
	}
}

func TestNamespacesFlag(t *testing.T) {
	cmd := NewCmd()
	if err := cmd.ParseFlags([]string{"--namespaces=shop, outlet,", "--leader-elect", "--kubeconfig=/dev/null"}); err != nil {
		t.Fatal(err)
	}
	ns, err := cmd.Flags().GetStringSlice("namespaces")
	if err != nil {
		t.Fatal(err)
	}
	got := watchedNamespaces(ns)
	if len(got) != 2 || got[0] != "shop" || got[1] != "outlet" {
		t.Errorf("namespaces %q, want [shop outlet]", got)
	}
	for name, want := range map[string]string{
		"metrics-bind-address":      ":8080",
		"health-probe-bind-address": ":8081",
		"leader-elect":              "true",
	} {
		if got := cmd.Flags().Lookup(name).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
}

// An API server that cannot be reached stops the start with an error that
// says so (the pod restarts with back-off), instead of a manager that looks
// alive and reconciles nothing.
func TestRunFailsWithoutAnAPIServer(t *testing.T) {
	opts := DefaultOptions()
	opts.HealthProbeBindAddress = freeAddr(t)
	opts.MetricsBindAddress = "0"
	cfg := &rest.Config{Host: "http://" + freeAddr(t)} // nothing listens there
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := Run(ctx, cfg, opts)
	if err == nil || !strings.Contains(err.Error(), "creating the manager") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Run = %v, want an error creating the manager: connection refused", err)
	}
}
