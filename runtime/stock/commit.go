package stock

import (
	"context"
	"fmt"
)

// MarkCommitted marks a reservation committed and takes it out of the expiry index.
// It returns 1 (marked), 2 (already committed), 0 (no such reservation) or
// CommitLedgerNeeded (its hash is gone, its index entry is not: call
// MarkCommittedFromLedger).
func (s *Store) MarkCommitted(ctx context.Context, shard int, key string) (int, error) {
	return s.markCommitted(ctx, shard, key)
}

// CommitLedgerNeeded is MarkCommitted's answer for a reservation whose hash
// is gone while its expiry-index entry still counts its units as reserved.
const CommitLedgerNeeded = 4

// MarkCommittedFromLedger is MarkCommitted for a reservation whose hash is
// gone: the ledger row's quantity and expiry take its units off the shard's
// reserved count, once (the index entry goes with them). It returns 3 when it
// did, 0 when there was nothing to do.
func (s *Store) MarkCommittedFromLedger(ctx context.Context, shard int, key string, qty int, expiryMs int64) (int, error) {
	return s.markCommitted(ctx, shard, key, qty, expiryMs)
}

func (s *Store) markCommitted(ctx context.Context, shard int, key string, ledgerRow ...any) (int, error) {
	k := s.shards[shard]
	n, err := commitScript.Run(ctx, s.rdb, []string{k.Meta(), k.Index(), k.Res(key), k.Paying()}, append([]any{key}, ledgerRow...)...).Int()
	if err != nil {
		return 0, fmt.Errorf("commit mark on shard %d: %w", shard, err)
	}
	return n, nil
}
