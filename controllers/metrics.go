package controllers

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

// Phases lists every phase, so that the phase gauge has a series per phase
// (1 for the current one) and an alert can match a phase that is not current.
var Phases = []flashsalev1alpha1.FlashSalePhase{
	flashsalev1alpha1.PhaseScheduled, flashsalev1alpha1.PhaseOpen, flashsalev1alpha1.PhasePaused,
	flashsalev1alpha1.PhaseSoldOut, flashsalev1alpha1.PhaseEnded, flashsalev1alpha1.PhaseCompleted,
	flashsalev1alpha1.PhaseFailClosed, flashsalev1alpha1.PhaseRebuilding,
}

// Labels every per-sale series carries.
const (
	labelNamespace = "namespace"
	labelName      = "name"
)

var (
	descUnits = prometheus.NewDesc("flashsale_sale_units",
		"Units of a sale by state (allocation, available, reserved, sold), as its status reports them.",
		[]string{labelNamespace, labelName, "sku", "state"}, nil)
	descPhase = prometheus.NewDesc("flashsale_sale_phase",
		"1 for a sale's current phase, 0 for the others.",
		[]string{labelNamespace, labelName, "phase"}, nil)
	descCondition = prometheus.NewDesc("flashsale_sale_condition",
		"1 when a sale's condition is True, 0 when False or Unknown.",
		[]string{labelNamespace, labelName, "condition", "reason"}, nil)
	descEpoch = prometheus.NewDesc("flashsale_sale_epoch",
		"Generation of a sale's Redis state: it goes up by one at every rebuild from the ledger.",
		[]string{labelNamespace, labelName}, nil)
	descLastRebuild = prometheus.NewDesc("flashsale_sale_last_rebuild_timestamp_seconds",
		"When a sale's stock was last rebuilt from the ledger.",
		[]string{labelNamespace, labelName}, nil)
	descCountsObserved = prometheus.NewDesc("flashsale_sale_counts_observed_timestamp_seconds",
		"When a sale's units were last read from Redis and the ledger: renewed at least every minute while they can be read (every 5 minutes once the sale is Completed), so an older value means flashsale_sale_units is stale.",
		[]string{labelNamespace, labelName}, nil)
	descListed = prometheus.NewDesc("flashsale_sale_metrics_listed",
		"1 when this manager could list the sales for these metrics: the leader, its cache synced; 0 on a follower.",
		nil, nil)
)

// saleCollector reports every FlashSale's status as the manager's cache holds
// it, at scrape time: one series per sale for alerts on the operator's own
// view (a sale failed closed, not Ready, selling out), and nothing to forget
// when a sale is deleted.
type saleCollector struct {
	reader client.Reader
}

// RegisterSaleMetrics adds the sales' gauges to registry (the manager's),
// replacing those of an earlier manager in the same process.
func RegisterSaleMetrics(registry prometheus.Registerer, reader client.Reader) error {
	return RegisterReplacing(registry, saleCollector{reader: reader})
}

// RegisterReplacing adds c to registry, replacing the collector of the same
// metrics an earlier manager in the same process registered.
func RegisterReplacing(registry prometheus.Registerer, c prometheus.Collector) error {
	err := registry.Register(c)
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		registry.Unregister(already.ExistingCollector)
		err = registry.Register(c)
	}
	return err
}

func (saleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUnits, descPhase, descCondition, descEpoch, descLastRebuild, descCountsObserved, descListed} {
		ch <- d
	}
}

func (c saleCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list flashsalev1alpha1.FlashSaleList
	err := c.reader.List(ctx, &list)
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descListed, boolValue(err == nil))
	if err != nil {
		// A follower (its controller, and the FlashSale informer with it, starts
		// with the leadership) or a cache not synced yet: no sale series, and
		// the rest of the manager's metrics still served.
		return
	}
	for i := range list.Items {
		fs := &list.Items[i]
		ns, name, st := fs.Namespace, fs.Name, &fs.Status
		for state, v := range map[string]int64{"allocation": st.Allocation, "available": st.Available, "reserved": st.Reserved, "sold": st.Sold} {
			gauge(descUnits, float64(v), ns, name, fs.Spec.SKU, state)
		}
		for _, p := range Phases {
			gauge(descPhase, boolValue(st.Phase == p), ns, name, string(p))
		}
		for _, typ := range []string{flashsalev1alpha1.ConditionReady, flashsalev1alpha1.ConditionAdmitting, flashsalev1alpha1.ConditionSeeded,
			flashsalev1alpha1.ConditionRedisHealthy, flashsalev1alpha1.ConditionLedgerHealthy, ConditionAllocationApplied,
			flashsalev1alpha1.ConditionDegraded, flashsalev1alpha1.ConditionClocksInStep, flashsalev1alpha1.ConditionLedgerFailoverSafe} {
			if cond := meta.FindStatusCondition(st.Conditions, typ); cond != nil {
				gauge(descCondition, boolValue(cond.Status == metav1.ConditionTrue), ns, name, typ, cond.Reason)
			}
		}
		gauge(descEpoch, float64(st.Epoch), ns, name)
		if st.LastRebuild != nil {
			gauge(descLastRebuild, float64(st.LastRebuild.Time.Unix()), ns, name)
		}
		if st.CountsObservedAt != nil {
			gauge(descCountsObserved, float64(st.CountsObservedAt.Unix()), ns, name)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
