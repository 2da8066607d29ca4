package controllers

import (
	"errors"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Each failure names its own reason, so `kubectl get fs -o wide` tells an SRE
// whether to look at the network, the ledger or the Redis version.
func TestUnhealthyReasons(t *testing.T) {
	for _, tc := range []struct {
		name              string
		err               error
		condition, reason string
		ready             string
	}{
		{"redis down", errors.New("dial tcp 127.0.0.1:6379: connection refused"),
			flashsalev1alpha1.ConditionRedisHealthy, ReasonUnreachable, ReasonRedisUnreachable},
		{"ledger down", &ledgerError{errors.New("connection refused")},
			flashsalev1alpha1.ConditionLedgerHealthy, ReasonUnreachable, ReasonLedgerUnreachable},
		{"redis too old", fmt.Errorf("redis: %w", fmt.Errorf("%w: 10.0.0.7:6379 runs 6.2.14", stock.ErrRedisTooOld)),
			flashsalev1alpha1.ConditionRedisHealthy, ReasonUnsupported, ReasonRedisUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scope{fs: &flashsalev1alpha1.FlashSale{}}
			(&FlashSaleReconciler{}).unhealthy(s, tc.err)
			conds := s.fs.Status.Conditions
			if c := meta.FindStatusCondition(conds, tc.condition); c == nil || c.Reason != tc.reason || c.Message != tc.err.Error() {
				t.Errorf("%s: %+v", tc.condition, c)
			}
			if c := meta.FindStatusCondition(conds, flashsalev1alpha1.ConditionReady); c == nil || c.Reason != tc.ready {
				t.Errorf("Ready: %+v", c)
			}
			if c := meta.FindStatusCondition(conds, flashsalev1alpha1.ConditionAdmitting); c == nil || c.Status != "False" {
				t.Errorf("Admitting: %+v", c)
			}
		})
	}
}
