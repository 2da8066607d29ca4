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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flashsale-dev/flashsale-operator/controllers"
)

// readableNamespaces is namespaces (all of them when empty) without those
// the manager may not read (left, each named in an error log): a namespace
// deleted with its Role (the chart's watchNamespaces) would keep the manager
// from starting, and every other namespace unmanaged. None readable is an
// error.
func readableNamespaces(ctx context.Context, cfg *rest.Config, namespaces []string) (readable, left []string, err error) {
	if len(namespaces) == 0 {
		return nil, nil, nil
	}
	c, err := client.New(cfg, client.Options{Scheme: NewScheme()})
	if err != nil {
		return nil, nil, err
	}
	readable, refused, err := controllers.ReadableNamespaces(ctx, c, namespaces)
	if err == nil && len(refused) > 0 {
		// A Role bound just before the manager started (an install) may
		// not be in the API server's authorizer yet: once more, shortly.
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(namespaceRecheck):
		}
		readable, refused, err = controllers.ReadableNamespaces(ctx, c, namespaces)
	}
	if err != nil {
		return nil, nil, err
	}
	for _, ns := range namespaces {
		if kind, ok := refused[ns]; ok {
			left = append(left, ns)
			ctrl.Log.WithName("manager").Error(nil, "not watching a namespace the manager may not read: its sales are not reconciled until it can, and the manager then restarts "+
				"(a namespace deleted with its Role: remove it from --namespaces, the chart's watchNamespaces)", "namespace", ns, "refused", kind)
		}
	}
	if len(readable) == 0 {
		return nil, nil, fmt.Errorf("the manager may read none of the namespaces it is to watch %v (refused: %v)", namespaces, refused)
	}
	return readable, left, nil
}

// namespaceRecheck is how long the start waits before it reads a refused
// namespace again.
const namespaceRecheck = 3 * time.Second

// namespaceRecheckEvery is how often a manager that left namespaces out
// reads them again.
const namespaceRecheckEvery = 30 * time.Second

// refusedNamespaces reads the namespaces the manager left out at its start
// again every so often, and stops the manager (its pod restarts) once one is
// readable: its cache watches the namespaces it was built with, so a
// namespace created again with its Role (a helm upgrade of the same values
// does not restart the manager) would stay unwatched.
type refusedNamespaces struct {
	cfg        *rest.Config
	namespaces []string
	every      time.Duration
}

// NeedLeaderElection: a follower restarts too, or it would lead later
// without them.
func (refusedNamespaces) NeedLeaderElection() bool { return false }

func (r refusedNamespaces) Start(ctx context.Context) error {
	c, err := client.New(r.cfg, client.Options{Scheme: NewScheme()})
	if err != nil {
		return err
	}
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		readable, _, err := controllers.ReadableNamespaces(ctx, c, r.namespaces)
		if err != nil {
			ctrl.Log.WithName("manager").Info("cannot read the namespaces left out", "namespaces", r.namespaces, "err", err)
			continue
		}
		if len(readable) > 0 {
			return fmt.Errorf("namespaces %v, left out at the start, are readable now: restarting to watch them", readable)
		}
	}
}

var descUnwatched = prometheus.NewDesc("flashsale_operator_namespace_unwatched",
	"1 for each namespace the manager is to watch (--namespaces) but left out at its start because it may not read it: its sales are not reconciled.",
	[]string{"namespace"}, nil)

// unwatchedNamespaces reports the namespaces left out at the start, so an
// alert names them: until the manager restarts they are not watched, and
// only its start's error log said so.
type unwatchedNamespaces []string

func (unwatchedNamespaces) Describe(ch chan<- *prometheus.Desc) { ch <- descUnwatched }

func (u unwatchedNamespaces) Collect(ch chan<- prometheus.Metric) {
	for _, ns := range u {
		ch <- prometheus.MustNewConstMetric(descUnwatched, prometheus.GaugeValue, 1, ns)
	}
}
