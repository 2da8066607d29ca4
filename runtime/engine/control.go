package engine

import (
	"context"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// Record is what the ledger keeps of the campaign for the operator: the
// Redis servers that held its verified shards and its last rebuild. It
// outlives the operator's process, and the FlashSale's status reports it.
func (e *Engine) Record(ctx context.Context) (ledger.Record, error) {
	rec, err := e.ledger.GetRecord(ctx, e.cfg.CampaignID)
	if err != nil {
		return ledger.Record{}, ledgerFailure("campaign record", err)
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
func (e *Engine) RecordRebuild(ctx context.Context, rb ledger.RebuildRecord, servers map[string]string) error {
	if err := e.ledger.RecordRebuild(ctx, e.cfg.CampaignID, rb, servers); err != nil {
		return ledgerFailure("campaign record", err)
	}
	return nil
}

// RecordFailClosed keeps the shards failed closed on a data loss: a rebuild
// is due until one at a later epoch is recorded (ledger.Record.RebuildDue).
func (e *Engine) RecordFailClosed(ctx context.Context, fc ledger.FailClosedRecord) error {
	if err := e.ledger.RecordFailClosed(ctx, e.cfg.CampaignID, fc); err != nil {
		return ledgerFailure("campaign record", err)
	}
	return nil
}
