package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
)

// The sales' gauges say what their status says: units by state, the current
// phase, the conditions and the epoch, one series per sale.
func TestSaleMetrics(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("metered", 10)
	markReady(t, e.ns, "metered-reserve") // buyers reach it: Admitting
	eng := e.engineFor(fs, sharedRedis.Addr())
	e.reserve(eng, "a")
	e.reserve(eng, "b")
	e.waitFor("metered", settle, "2 reserved", func(fs *flashsalev1alpha1.FlashSale) bool { return fs.Status.Reserved == 2 })

	registry := prometheus.NewRegistry()
	if err := controllers.RegisterSaleMetrics(registry, k8s); err != nil {
		t.Fatal(err)
	}
	// A second manager in the same process takes the registration over.
	if err := controllers.RegisterSaleMetrics(registry, k8s); err != nil {
		t.Fatalf("registering again: %v", err)
	}
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] != e.ns {
				continue
			}
			delete(labels, "namespace")
			delete(labels, "name")
			var parts []string
			for _, k := range []string{"sku", "state", "phase", "condition", "reason"} {
				if v, ok := labels[k]; ok {
					parts = append(parts, k+"="+v)
				}
			}
			got = append(got, f.GetName()+"{"+strings.Join(parts, ",")+"} "+strconv.FormatFloat(m.GetGauge().GetValue(), 'f', -1, 64))
		}
	}
	if v := listed(t, registry); v != 1 {
		t.Errorf("flashsale_sale_metrics_listed %v, want 1", v)
	}
	text := strings.Join(got, "\n")
	for _, want := range []string{
		"flashsale_sale_units{sku=itm-metered,state=allocation} 10",
		"flashsale_sale_units{sku=itm-metered,state=available} 8",
		"flashsale_sale_units{sku=itm-metered,state=reserved} 2",
		"flashsale_sale_units{sku=itm-metered,state=sold} 0",
		"flashsale_sale_phase{phase=Open} 1",
		"flashsale_sale_phase{phase=FailClosed} 0",
		"flashsale_sale_condition{condition=Seeded,reason=Seeded} 1",
		"flashsale_sale_condition{condition=Admitting,reason=Open} 1",
		"flashsale_sale_condition{condition=ClocksInStep,reason=InStep} 1",
		"flashsale_sale_condition{condition=LedgerFailoverSafe,reason=NoStandby} 1",
		"flashsale_sale_epoch{} 1",
		fmt.Sprintf("flashsale_sale_counts_observed_timestamp_seconds{} %d", e.get("metered").Status.CountsObservedAt.Unix()),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %s in\n%s", want, text)
		}
	}
}

// failingList is a reader whose List fails, as a follower's cache does.
type failingList struct{ client.Reader }

func (failingList) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("the informer starts with the leadership")
}

// A manager that cannot list the sales (a follower) says so, and reports no
// sale series; the scrape still succeeds.
func TestSaleMetricsOnAFollower(t *testing.T) {
	registry := prometheus.NewRegistry()
	if err := controllers.RegisterSaleMetrics(registry, failingList{}); err != nil {
		t.Fatal(err)
	}
	if v := listed(t, registry); v != 0 {
		t.Fatalf("flashsale_sale_metrics_listed %v, want 0", v)
	}
	families, _ := registry.Gather()
	if len(families) != 1 {
		t.Fatalf("%d metric families, want only flashsale_sale_metrics_listed", len(families))
	}
}

func listed(t *testing.T, registry *prometheus.Registry) float64 {
	t.Helper()
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "flashsale_sale_metrics_listed" {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no flashsale_sale_metrics_listed")
	return 0
}
