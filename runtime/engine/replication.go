package engine

import (
	"context"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// Replication is how the ledger's commits reach its standbys.
type Replication = ledger.Replication

// LedgerReplication reads how the ledger's commits reach the standbys its
// server streams to: a failover to an asynchronous one loses the last
// reservations and payments the sale answered for.
func (e *Engine) LedgerReplication(ctx context.Context) (Replication, error) {
	r, err := e.ledger.Replication(ctx)
	if err != nil {
		return r, ledgerFailure("replication", err)
	}
	return r, nil
}
