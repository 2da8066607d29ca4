package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// clockVerdict is ClocksInStep's verdict: in step, or the message saying
// which clock is off and what that does to the sale.
type clockVerdict struct {
	inStep  bool
	message string
}

// readClocks compares the ledger's clock with the Redis servers', briefly:
// a ledger or a Redis that does not answer (or refuses TIME) is reported by
// the phases that need them, and ClocksInStep keeps what it said.
func (r *FlashSaleReconciler) readClocks(ctx context.Context, s *scope) {
	ctx, cancel := context.WithTimeout(ctx, replaceTimeout)
	defer cancel()
	skew, err := s.conn.engine.ClockSkew(ctx)
	if err != nil {
		log.FromContext(ctx).V(1).Info("clocks not read", "err", err)
		return
	}
	was := meta.FindStatusCondition(s.fs.Status.Conditions, flashsalev1alpha1.ConditionClocksInStep)
	s.clocks = judgeClocks(skew, resolve(s.fs).ttl, was != nil && was.Status == metav1.ConditionFalse)
}

// clockSkewBound is the difference ClocksInStep tolerates for a sale whose
// reservations last ttl: a second (NTP keeps hosts within milliseconds, so a
// second is a clock not kept), less for short reservations.
func clockSkewBound(ttl time.Duration) time.Duration {
	return min(time.Second, ttl/10)
}

// judgeClocks says whether skew, measured for a sale whose reservations last
// ttl, is beyond the bound even at the end of its uncertainty most in its
// favour (apart), or within it even at the other end (in step); between the
// two the reading cannot tell, and there is no verdict. Clocks found apart
// are in step again only within half the bound, so a difference hovering at
// the bound does not turn the condition (and send events) at every refresh.
// Its figures are rounded so that a steady difference writes the status
// once, not with every reading's jitter.
func judgeClocks(skew engine.ClockSkew, ttl time.Duration, apart bool) *clockVerdict {
	bound := clockSkewBound(ttl)
	again := bound / 2
	least, most := skew.AtLeast(), skew.Ahead.Abs()+skew.Uncertainty
	switch {
	case least > bound || (apart && least > again):
	case most <= bound && (!apart || most <= again):
		return &clockVerdict{inStep: true, message: fmt.Sprintf(
			"PostgreSQL's clock and the Redis servers' agree within %s", bound)}
	default:
		return nil
	}
	by := roughly(skew.Ahead.Abs())
	tolerates := fmt.Sprintf("this sale tolerates %s, and counts them in step again under %s", bound, again)
	if skew.Ahead > 0 {
		return &clockVerdict{message: fmt.Sprintf(
			"PostgreSQL's clock is %s ahead of Redis %s's (%s): every reservation (reservation.ttl %s) has %s less to be paid than its expires_at says, and a checkout that late is answered 410; set both hosts' clocks by NTP",
			by, skew.Server, tolerates, ttl, by)}
	}
	return &clockVerdict{message: fmt.Sprintf(
		"PostgreSQL's clock is %s behind Redis %s's (%s): expired reservations are given back to the stock %s late, and checkouts are taken up to %s past their expires_at; set both hosts' clocks by NTP",
		by, skew.Server, tolerates, by, by)}
}

// roughly is d to two significant figures, at least a millisecond.
func roughly(d time.Duration) time.Duration {
	unit := time.Millisecond
	for d >= 100*unit {
		unit *= 10
	}
	return d.Round(unit)
}
