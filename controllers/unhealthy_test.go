package controllers

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
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
		says              string // in the condition's message
	}{
		{"redis down", errors.New("dial tcp 127.0.0.1:6379: connection refused"),
			flashsalev1alpha1.ConditionRedisHealthy, ReasonUnreachable, ReasonRedisUnreachable, "connection refused"},
		{"ledger down", &ledgerError{errors.New("connection refused")},
			flashsalev1alpha1.ConditionLedgerHealthy, ReasonUnreachable, ReasonLedgerUnreachable, "PostgreSQL ledger unreachable: connection refused"},
		{"ledger refuses the password", &ledgerError{fmt.Errorf("ledger: connect: %w", &pgconn.PgError{Severity: "FATAL", Code: "28P01", Message: "password authentication failed"})},
			flashsalev1alpha1.ConditionLedgerHealthy, ReasonForbidden, ReasonLedgerForbidden, "refused the operator: ledger: connect: FATAL: password authentication failed"},
		{"ledger schema being upgraded", &ledgerError{fmt.Errorf("ledger: migrate: %w (migration 0003_request_key, for 42s; it goes on): context deadline exceeded", ledger.ErrMigrating)},
			flashsalev1alpha1.ConditionLedgerHealthy, ReasonMigrating, ReasonLedgerMigrating, "migration 0003_request_key, for 42s"},
		{"ledger DSN that does not parse", &ledgerError{fmt.Errorf("%w: invalid port", ledger.ErrBadDSN)},
			flashsalev1alpha1.ConditionLedgerHealthy, ReasonInvalid, ReasonLedgerSecretInvalid, `key "dsn": ledger: the DSN cannot be parsed: invalid port`},
		{"redis too old", fmt.Errorf("redis: %w", fmt.Errorf("%w: 10.0.0.7:6379 runs 6.2.14", stock.ErrRedisTooOld)),
			flashsalev1alpha1.ConditionRedisHealthy, ReasonUnsupported, ReasonRedisUnsupported, "runs 6.2.14"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scope{fs: &flashsalev1alpha1.FlashSale{}}
			(&FlashSaleReconciler{}).unhealthy(s, tc.err)
			s.fs.Status = computeStatus(s.fs, &s.facts, DefaultCountsStamp)
			conds := s.fs.Status.Conditions
			if c := meta.FindStatusCondition(conds, tc.condition); c == nil || c.Reason != tc.reason || !strings.Contains(c.Message, tc.says) {
				t.Errorf("%s: %+v", tc.condition, c)
			}
			if c := meta.FindStatusCondition(conds, flashsalev1alpha1.ConditionReady); c == nil || c.Reason != tc.ready {
				t.Errorf("Ready: %+v", c)
			}
			if c := meta.FindStatusCondition(conds, flashsalev1alpha1.ConditionAdmitting); c == nil || c.Status != "False" {
				t.Errorf("Admitting: %+v", c)
			}
			// One Warning when it starts, none while it lasts, one Normal when over.
			healthy := []metav1.Condition{{Type: tc.condition, Status: metav1.ConditionTrue, Reason: ReasonReachable}}
			s.healthEvents(healthy)
			if len(s.events) != 1 || s.events[0].kind != "Warning" || s.events[0].reason != tc.ready {
				t.Errorf("events when it starts: %+v", s.events)
			}
			s.events = nil
			s.healthEvents(slices.Clone(conds))
			if len(s.events) != 0 {
				t.Errorf("events while it lasts: %+v", s.events)
			}
			failing := slices.Clone(conds)
			s.fs.Status.Conditions = healthy
			s.healthEvents(failing)
			if len(s.events) != 1 || s.events[0].kind != "Normal" || !strings.HasSuffix(s.events[0].reason, "Recovered") {
				t.Errorf("events when it is over: %+v", s.events)
			}
		})
	}
}
