package engine

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// What the controller reads of the shards and the ledger, under the engine's
// names: the controller goes through the engine alone.
const (
	StateOpen       = stock.StateOpen
	StateNotStarted = stock.StateNotStarted
	StatePaused     = stock.StatePaused
	StateEnded      = stock.StateEnded
	// GateSet is Gates.CloseOpen's outcome for a shard whose gate was written.
	GateSet = stock.GateSet
)

type (
	// ShardState is one shard's gate, epoch and stock (Gates.ShardStates).
	ShardState = stock.ShardState
	// ServerCheck is the run ids of the servers holding the shards, and
	// whether one may evict keys (Engine.Servers).
	ServerCheck = stock.ServerCheck
	// Record is the ledger's record of the campaign for the operator.
	Record = ledger.Record
	// RebuildRecord is a rebuild as the ledger keeps it.
	RebuildRecord = ledger.RebuildRecord
	// FailClosedRecord is a fail-close as the ledger keeps it.
	FailClosedRecord = ledger.FailClosedRecord
	// Campaign is the ledger's campaign row (Engine.Campaign).
	Campaign = ledger.Campaign
)

var (
	// ErrRebuilt: a shard is being rebuilt, or was rebuilt since the ledger
	// was read (an allocation change is retried over the rebuild's result).
	ErrRebuilt = stock.ErrRebuilt
	// ErrEpochChanged: the campaign was rebuilt since units were withdrawn
	// for a decrease.
	ErrEpochChanged = ledger.ErrEpochChanged
	// ErrCountsDrift: a rebuild found the ledger's per-shard counters apart
	// from its orders, and computed no stock from them.
	ErrCountsDrift = ledger.ErrCountsDrift
	// ErrEvictionPolicy: a Redis server holding shards may evict keys.
	ErrEvictionPolicy = stock.ErrEvictionPolicy
	// ErrRedisTooOld: a Redis server is older than the shards need.
	ErrRedisTooOld = stock.ErrRedisTooOld
	// ErrBadDSN: the ledger's connection string cannot be parsed (Dial).
	ErrBadDSN = ledger.ErrBadDSN
	// ErrMigrating: Dial stopped waiting for the ledger's schema upgrade,
	// which goes on.
	ErrMigrating = ledger.ErrMigrating
	// ErrCampaignNotFound: the ledger has no row for the campaign.
	ErrCampaignNotFound = ledger.ErrCampaignNotFound
	// ErrServerChanged: a Redis server holding a shard restarted, or was
	// replaced by a failover, while a rebuild wrote it; it opened nothing.
	ErrServerChanged = stock.ErrRebuildServerChanged
)

// Record is what the ledger keeps of the campaign for the operator: the
// Redis servers that held its verified shards and its last rebuild. It
// outlives the operator's process, and the FlashSale's status reports it.
func (e *Engine) Record(ctx context.Context) (Record, error) {
	rec, err := e.ledger.GetRecord(ctx, e.cfg.CampaignID)
	if err != nil {
		return Record{}, ledgerFailure("campaign record", err)
	}
	return rec, nil
}

// RecordServers keeps the Redis servers (address → run id) that hold the
// campaign's verified shards.
func (e *Engine) RecordServers(ctx context.Context, servers map[string]string) error {
	if err := e.ledger.RecordServers(ctx, e.cfg.CampaignID, servers); err != nil {
		return ledgerFailure("campaign record", err)
	}
	return nil
}

// RecordRebuild keeps a rebuild of the shards and the servers (address → run
// id) it wrote them to.
func (e *Engine) RecordRebuild(ctx context.Context, rb RebuildRecord, servers map[string]string) error {
	if err := e.ledger.RecordRebuild(ctx, e.cfg.CampaignID, rb, servers); err != nil {
		return ledgerFailure("campaign record", err)
	}
	return nil
}

// RecordFailClosed keeps the shards failed closed on a data loss: a rebuild
// is due until one at a later epoch is recorded (ledger.Record.RebuildDue).
func (e *Engine) RecordFailClosed(ctx context.Context, fc FailClosedRecord) error {
	if err := e.ledger.RecordFailClosed(ctx, e.cfg.CampaignID, fc); err != nil {
		return ledgerFailure("campaign record", err)
	}
	return nil
}

// Gates reads and closes the campaign's shards on the engine's Redis.
func (e *Engine) Gates() *Gates { return &Gates{store: e.store} }

// FailClose closes every shard that has a meta, whatever its epoch, until a
// rebuild reopens it (shards without one refuse already).
func (e *Engine) FailClose(ctx context.Context) error {
	return e.Gates().FailClose(ctx)
}

// Servers reads the run ids of the Redis servers holding the shards, and
// whether one may evict keys.
func (e *Engine) Servers(ctx context.Context) (ServerCheck, error) {
	return e.store.Servers(ctx)
}

// StampShards records, in the meta of shards seeded before metas recorded
// their server, the server holding them now.
func (e *Engine) StampShards(ctx context.Context) (int, error) {
	return e.store.Stamp(ctx)
}

// Gates reads and closes a campaign's shards through Redis alone: closing
// needs no ledger (opening does), so a caller whose ledger does not answer
// can still close a sale.
type Gates struct{ store *stock.Store }

// RedisGates is the campaign's Gates on rdb.
func RedisGates(rdb redis.UniversalClient, campaignID string, shards int) *Gates {
	return &Gates{store: stock.New(rdb, campaignID, shards)}
}

// ShardStates reads every shard's gate, epoch and stock, and whether the
// server holding it is the one that wrote it (stock.Store.State).
func (g *Gates) ShardStates(ctx context.Context) ([]ShardState, error) {
	return g.store.State(ctx)
}

// CloseOpen writes the closing gate on every shard that is OPEN, whatever its
// epoch, and says per shard what came of it (GateSet when written).
func (g *Gates) CloseOpen(ctx context.Context, gate string) ([]int, error) {
	return g.store.CloseOpen(ctx, gate)
}

// SetWindow writes the sale's schedule (zero times: no bound) into every
// shard that has a meta, where the reserve script enforces it by the Redis
// clock whatever the gate (stock.Store.SetWindow).
func (g *Gates) SetWindow(ctx context.Context, start, end time.Time) ([]int, error) {
	return g.store.SetWindow(ctx, start, end)
}

// Now is the Redis server's clock, by which the reserve script enforces the
// sale's schedule.
func (g *Gates) Now(ctx context.Context) (time.Time, error) { return g.store.Now(ctx) }

// FailClose closes every shard that has a meta until a rebuild: Redis is
// found to have lost the sale's state, whatever the ledger answers.
func (g *Gates) FailClose(ctx context.Context) error {
	_, err := g.store.SetGate(ctx, stock.StateFailClosed, 0)
	return err
}

// End writes ENDED on every shard that has a meta, whatever its epoch.
func (g *Gates) End(ctx context.Context) error {
	_, err := g.store.SetGate(ctx, stock.StateEnded, 0)
	return err
}
