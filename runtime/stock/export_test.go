package stock

import "context"

// RebuildBeginStep is one of RebuildBegin's calls: it closes shard n for the
// rebuild under epoch and wipes at most batch reservations, so a test can act
// between two of them. It returns the reservations still indexed.
func (s *Store) RebuildBeginStep(ctx context.Context, n int, epoch int64, batch int) (int64, error) {
	k := s.shards[n]
	return rebuildBeginScript.Run(ctx, s.rdb, []string{k.Stock(), k.Meta(), k.Index(), k.Users(), k.Claims()}, epoch, k.ResPrefix(), batch).Int64()
}
