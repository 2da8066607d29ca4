package controllers

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// connect reads the referenced Secrets and opens (or reuses) the Redis and ledger
// connections. A missing Secret or key stops here with a condition naming it,
// unless the sale's connections are already open: a Secret deleted or broken
// during the sale (a rotation by delete and recreate, a GitOps prune) must not
// stop the pause switch and the schedule's end from closing it. Without them
// (an operator restarted, or another one leading since), the closing gate is
// written through Redis alone, which is all it needs.
func (r *FlashSaleReconciler) connect(ctx context.Context, s *scope) (bool, error) {
	refs, err := readReferences(ctx, r.secrets, s.fs)
	var refErr *referenceError
	if errors.As(err, &refErr) {
		s.requeueAfter(waitForReferences)
		s.refErr = refErr
		c := r.conns.cached(types.NamespacedName{Namespace: s.fs.Namespace, Name: s.fs.Name})
		if c != nil && c.engine.Config().CampaignID == string(s.fs.UID) {
			s.conn = c
			s.refsKept = true // the spec's Secrets are not what these connections use
			return false, nil
		}
		if refs, err := readRedisReferences(ctx, r.secrets, s.fs); err == nil {
			store, done := redisOnly(s.fs, &refs)
			s.closed = r.closeShards(ctx, s, store)
			done()
		}
		return true, nil
	}
	if err != nil {
		return true, err
	}
	s.refs = &refs
	set := resolve(s.fs)
	cfg := engine.Config{
		CampaignID: string(s.fs.UID), Namespace: s.fs.Namespace, Name: s.fs.Name, SKU: s.fs.Spec.SKU,
		Allocation: s.fs.Spec.Allocation, Shards: int(set.shards), MaxPerUser: int(set.maxPerUser),
		TTL: set.ttl, Grace: set.grace, StealProbes: int(set.stealProbes),
		IDSecret: config.DeriveIDSecret(refs.admissionKey),
	}
	name := types.NamespacedName{Namespace: s.fs.Namespace, Name: s.fs.Name}
	gctx := ctx
	prev := r.conns.cached(name)
	if prev != nil && prev.engine.Config().CampaignID != string(s.fs.UID) {
		prev = nil // a sale of the same name, deleted since
	}
	if prev != nil {
		// Replacing connections that work: a new ledger or Redis that does
		// not answer must not delay the gates applied with the old ones.
		var cancel context.CancelFunc
		gctx, cancel = context.WithTimeout(ctx, replaceTimeout)
		defer cancel()
	}
	conn, err := r.conns.get(gctx, name, refs, cfg)
	if err != nil && prev != nil {
		// Secrets changed to values that do not connect (a rotation to a
		// wrong DSN): as with a Secret gone, the sale goes on being gated
		// and observed with the connections opened before. Their health is
		// what the phases below find; only Ready says what is wrong here.
		f := describeFailure(s.fs, err)
		secret := fmt.Sprintf("Redis Secret %q", s.fs.Spec.Redis.SecretRef.Name)
		if f.condition == flashsalev1alpha1.ConditionLedgerHealthy {
			secret = fmt.Sprintf("ledger Secret %q", s.fs.Spec.Postgres.SecretRef.Name)
		}
		f.message = "new connections, for the current values of the " + secret + " or a changed spec, do not open: " + f.message +
			" (the sale is still served and gated with the connections opened before)"
		s.replaced = &f
		// One Warning per set of values: the health conditions stay True (the
		// connections in use are fine), so their events and alerts say
		// nothing, and the pods read the new values when they restart.
		if told := f.readyReason + "|" + refs.storeFingerprint(); prev.replacementTold != told {
			prev.replacementTold = told
			s.event(corev1.EventTypeWarning, f.readyReason, "%s", f.message)
		}
		s.refs = nil // the pods are not rolled onto values that do not connect
		s.conn = prev
		s.requeueAfter(retryUnhealthy)
		return false, nil
	}
	if err != nil {
		r.unhealthy(s, err)
		if isLedgerError(err) {
			// The connections did not open because the ledger did not:
			// close through Redis alone, and say what Redis lost meanwhile
			// (a manager started during the outage has no other way in).
			store, done := redisOnly(s.fs, s.refs)
			s.closed = r.closeShards(ctx, s, store)
			r.lostWithoutConnections(ctx, s, store)
			done()
		}
		return true, nil
	}
	s.conn = conn
	// A new connection reached the ledger. A cached one is asked when the
	// ledger was last found down on it: the phases below may stop at Redis
	// before any ledger query, and the recovery would not show until Redis
	// is back.
	if conn != prev || (conn.ledgerDown.Load() && pingLedger(ctx, conn) == nil) {
		s.ledgerOK = true
	}
	return false, nil
}

// unhealthy records a Redis or ledger failure: the sale is closed (no reservation
// can be made durable or taken) and the controller retries soon.
func (r *FlashSaleReconciler) unhealthy(s *scope, err error) {
	s.outage = err
	s.requeueAfter(retryUnhealthy)
}

// failure is what a Redis or ledger error says in the status: the health
// condition it turns False, with its reason, and Ready's reason.
type failure struct {
	condition, reason, readyReason, message string
}

func describeFailure(fs *flashsalev1alpha1.FlashSale, err error) failure {
	var le *ledgerError
	onLedger := func(reason, readyReason, message string) failure {
		return failure{flashsalev1alpha1.ConditionLedgerHealthy, reason, readyReason, message}
	}
	onRedis := func(reason, readyReason string) failure {
		return failure{flashsalev1alpha1.ConditionRedisHealthy, reason, readyReason, err.Error()}
	}
	switch {
	case errors.As(err, &le) && errors.Is(err, engine.ErrBadDSN):
		return onLedger(ReasonInvalid, ReasonLedgerSecretInvalid,
			fmt.Sprintf("ledger Secret %q key %q: %s", fs.Spec.Postgres.SecretRef.Name, resolve(fs).postgresKey, le.err.Error()))
	case errors.As(err, &le) && errors.Is(err, engine.ErrMigrating):
		return onLedger(ReasonMigrating, ReasonLedgerMigrating, err.Error())
	case errors.As(err, &le) && engine.LedgerReadOnly(err):
		return onLedger(ReasonReadOnly, ReasonLedgerReadOnly, "PostgreSQL ledger takes no writes, so no reservation can be recorded: "+le.err.Error())
	case errors.As(err, &le) && pgForbidden(err):
		return onLedger(ReasonForbidden, ReasonLedgerForbidden, "PostgreSQL ledger refused the operator: "+le.err.Error())
	case errors.As(err, &le):
		return onLedger(ReasonUnreachable, ReasonLedgerUnreachable, err.Error())
	case errors.Is(err, engine.ErrEvictionPolicy):
		return onRedis(ReasonEvictionPolicy, ReasonRedisEvictionPolicy)
	case errors.Is(err, engine.ErrRedisTooOld):
		return onRedis(ReasonUnsupported, ReasonRedisUnsupported)
	case redis.IsAuthError(err) || redis.IsPermissionError(err):
		// Wrong credentials, or an ACL user without a command the operator needs.
		return onRedis(ReasonForbidden, ReasonRedisForbidden)
	}
	return onRedis(ReasonUnreachable, ReasonRedisUnreachable)
}

// pgForbidden reports a PostgreSQL refusal of the credentials or of a
// permission: no such role or no pg_hba entry, a wrong password, or a missing
// privilege (the migrations create tables).
func pgForbidden(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "28000" || pe.Code == "28P01" || pe.Code == "42501")
}

// isLedgerError: err came from the ledger (see classify).
func isLedgerError(err error) bool {
	var le *ledgerError
	return errors.As(err, &le)
}

// lostWithoutConnections is lostWhileLedgerDown for a reconcile whose
// connections did not open: the shards are read through Redis alone.
func (r *FlashSaleReconciler) lostWithoutConnections(ctx context.Context, s *scope, gates *engine.Gates) {
	rctx, cancel := closingContext(ctx)
	states, err := gates.ShardStates(rctx)
	cancel()
	if err != nil {
		return
	}
	missing := 0
	for _, st := range states {
		if !st.Present {
			missing++
		}
	}
	r.lostWhileLedgerDown(ctx, s, missing, len(states), gates)
}

// classify turns errors that come from the ledger into ledgerErrors: the
// ledger did not answer or refused. A ledger whose counters disagree with its
// orders answered; that is reported on its own (ReasonCountsDrift).
func classify(err error) error {
	var le *ledgerError
	if errors.As(err, &le) || errors.Is(err, engine.ErrCountsDrift) {
		return err
	}
	if errors.Is(err, engine.ErrLedger) {
		return &ledgerError{err}
	}
	return err
}

// ledgerUnreachable: err says the ledger did not answer (not that it refused
// the operator, or that its DSN is invalid).
func ledgerUnreachable(fs *flashsalev1alpha1.FlashSale, err error) bool {
	if err == nil || !isLedgerError(err) {
		return false
	}
	f := describeFailure(fs, err)
	return f.condition == flashsalev1alpha1.ConditionLedgerHealthy && f.reason == ReasonUnreachable
}

// pingLedger asks the ledger for a sign of life, briefly: a ledger that hangs
// must not hold up the phases that do not need it.
func pingLedger(ctx context.Context, c *campaignConn) error {
	ctx, cancel := context.WithTimeout(ctx, replaceTimeout)
	defer cancel()
	return c.engine.PingLedger(ctx)
}
