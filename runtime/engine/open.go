package engine

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// Dial opens the campaign's ledger at dsn (applying its migrations) with at
// most maxConns connections, builds an engine on it and rdb, and checks that
// Redis answers: a Redis client dials lazily, and a caller replacing
// connections that work must know the new ones do too. The engine owns the
// ledger (Close closes it); rdb stays the caller's.
//
// A ledger that does not open is an ErrLedger whose message is the ledger's
// own (ledger.ErrBadDSN for a DSN that cannot be parsed, see ErrBadDSN);
// Redis not answering is an error naming Redis.
func Dial(ctx context.Context, cfg Config, rdb redis.UniversalClient, dsn string, maxConns int32) (*Engine, error) {
	l, err := ledger.Open(ctx, dsn, ledger.WithMaxConns(maxConns))
	if err != nil {
		return nil, &openError{err}
	}
	e, err := New(cfg, rdb, l, ledger.MaterializerConfig{})
	if err != nil {
		l.Close()
		return nil, err
	}
	e.ownsLedger = true
	if err := e.store.Ping(ctx); err != nil {
		e.Close()
		return nil, fmt.Errorf("redis: %w", err)
	}
	return e, nil
}

// openError is a ledger that did not open: an ErrLedger that says only what
// the ledger said.
type openError struct{ err error }

func (e *openError) Error() string   { return e.err.Error() }
func (e *openError) Unwrap() []error { return []error{ErrLedger, e.err} }

// LedgerReadOnly reports whether err says that PostgreSQL answers but takes
// no writes (a standby, a demoted primary).
func LedgerReadOnly(err error) bool { return ledger.ReadOnly(err) }

// PingLedger checks that PostgreSQL answers and takes writes.
func (e *Engine) PingLedger(ctx context.Context) error {
	if err := e.ledger.Ping(ctx); err != nil {
		return ledgerFailure("ping", err)
	}
	return nil
}

// PingRedis checks that Redis answers (every node, on a cluster).
func (e *Engine) PingRedis(ctx context.Context) error { return e.store.Ping(ctx) }

// Campaign is the ledger's campaign row (ErrCampaignNotFound when there is
// none, or it is an ErrLedger).
func (e *Engine) Campaign(ctx context.Context) (Campaign, error) {
	c, err := e.ledger.GetCampaign(ctx, e.cfg.CampaignID)
	if err != nil {
		return Campaign{}, ledgerFailure("campaign", err)
	}
	return c, nil
}

// Allocation is the allocation in effect, as the ledger's campaign row says.
func (e *Engine) Allocation(ctx context.Context) (int64, error) {
	c, err := e.ledger.GetCampaign(ctx, e.cfg.CampaignID)
	if err != nil {
		return 0, ledgerFailure("campaign", err)
	}
	return c.Allocation, nil
}
