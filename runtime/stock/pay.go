package stock

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Paying is an entry of a shard's paying index (pay.lua): a checkout of the
// reservation with this key began at AtMs (Redis clock) and has not been
// settled in Redis since.
type Paying struct {
	Key  string
	AtMs int64
}

// MarkPaying marks user's RESERVED reservation on shard as being paid, before
// the checkout commits it in the ledger; commit.lua takes the mark away. It
// returns the mark's time, or 0 when the reservation is not user's RESERVED one
// (nothing was marked).
func (s *Store) MarkPaying(ctx context.Context, shard int, key, user string) (int64, error) {
	k := s.shards[shard]
	at, err := payScript.Run(ctx, s.rdb, []string{k.Res(key), k.Paying()}, "mark", key, user).Int64()
	if err != nil {
		return 0, fmt.Errorf("paying mark on shard %d: %w", shard, err)
	}
	return at, nil
}

// DropPaying takes the mark made at atMs away, unless a later checkout has
// marked the reservation again since. It reports whether it did.
func (s *Store) DropPaying(ctx context.Context, shard int, key string, atMs int64) (bool, error) {
	k := s.shards[shard]
	n, err := payScript.Run(ctx, s.rdb, []string{k.Res(key), k.Paying()}, "drop", key, atMs).Int()
	if err != nil {
		return false, fmt.Errorf("paying drop on shard %d: %w", shard, err)
	}
	return n == 1, nil
}

// PayingEntries lists up to limit entries of shard's paying index, oldest
// first, from the offset-th.
func (s *Store) PayingEntries(ctx context.Context, shard, offset, limit int) ([]Paying, error) {
	zs, err := s.rdb.ZRangeWithScores(ctx, s.shards[shard].Paying(), int64(offset), int64(offset+limit)-1).Result()
	if err != nil {
		return nil, fmt.Errorf("paying index of shard %d: %w", shard, err)
	}
	out := make([]Paying, len(zs))
	for i, z := range zs {
		out[i] = Paying{Key: memberString(z), AtMs: int64(z.Score)}
	}
	return out, nil
}

func memberString(z redis.Z) string {
	s, _ := z.Member.(string)
	return s
}
