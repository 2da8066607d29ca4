package stock

import (
	"context"
	"fmt"
)

// MarkCommitted marks a reservation committed and takes it out of the expiry index.
// It returns 1 (marked), 2 (already committed), 0 (no such reservation),
// CommitLedgerNeeded (its hash is gone, its index entry is not: call
// MarkCommittedFromLedger) or CommitRebuilding.
func (s *Store) MarkCommitted(ctx context.Context, shard int, key string) (int, error) {
	return s.markCommitted(ctx, shard, key, "", "")
}

// CommitLedgerNeeded is MarkCommitted's answer for a reservation whose hash
// is gone while its expiry-index entry still counts its units as reserved.
const CommitLedgerNeeded = 4

// CommitRebuilding is MarkCommitted's answer while the shard is being
// rebuilt: nothing changed. A rebuild starts the shard's reserved count
// from zero and counts what the ledger says is pending; a mark between its
// wipe's steps would take a sold reservation off a count that never held
// it. The sweeper marks it after the rebuild, if the rebuild restored it.
const CommitRebuilding = 5

// MarkCommittedFromLedger is MarkCommitted for a reservation whose hash is
// gone: the ledger row's quantity and expiry take its units off the shard's
// reserved count, once (the index entry goes with them). It returns 3 when it
// did, 0 when there was nothing to do, or CommitRebuilding.
func (s *Store) MarkCommittedFromLedger(ctx context.Context, shard int, key string, qty int, expiryMs int64) (int, error) {
	return s.markCommitted(ctx, shard, key, qty, expiryMs)
}

func (s *Store) markCommitted(ctx context.Context, shard int, key string, qty, expiryMs any) (int, error) {
	k := s.shards[shard]
	n, err := commitScript.Run(ctx, s.rdb, []string{k.Meta(), k.Index(), k.Res(key), k.Paying()}, key, qty, expiryMs, seconds(s.backstop)).Int()
	if err != nil {
		return 0, fmt.Errorf("commit mark on shard %d: %w", shard, err)
	}
	return n, nil
}
