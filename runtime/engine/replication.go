package engine

import (
	"context"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

type (
	// Replication is how the ledger's commits reach its standbys.
	Replication = ledger.Replication
	// Standby is one physical standby of the ledger's server.
	Standby = ledger.Standby
)

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
