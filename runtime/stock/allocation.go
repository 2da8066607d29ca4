package stock

import (
	"context"
	"errors"
	"fmt"
)

// Seed writes a shard's first stock and meta; it never touches a live shard and
// reports whether it seeded.
func (s *Store) Seed(ctx context.Context, shard int, units, epoch int64, state string, lastChange int64) (bool, error) {
	k := s.shards[shard]
	n, err := seedScript.Run(ctx, s.rdb, []string{k.Stock(), k.Meta()}, units, epoch, state, lastChange).Int()
	if err != nil {
		return false, fmt.Errorf("seed shard %d: %w", shard, err)
	}
	return n == 1, nil
}

// ErrRebuilt refuses an allocation change on a shard that is being rebuilt,
// or was rebuilt at another epoch than the ledger's the caller read: the
// rebuild writes the shard from its own snapshot of the ledger.
var ErrRebuilt = errors.New("the shard is being rebuilt, or was rebuilt since the ledger was read")

// Adjust applies one recorded allocation change to a shard exactly once: 1 applied,
// 0 already applied, -1 no meta. For an increase stockDelta = allocDelta > 0; for a
// decrease stockDelta = 0, allocDelta < 0 and settled = -allocDelta withdrawn units.
// epoch is the ledger's epoch the caller read (0: any); see ErrRebuilt.
func (s *Store) Adjust(ctx context.Context, shard int, epoch, changeID, allocDelta, stockDelta, settled int64) (int, error) {
	k := s.shards[shard]
	n, err := adjustScript.Run(ctx, s.rdb, []string{k.Stock(), k.Meta()}, changeID, allocDelta, stockDelta, settled, epoch).Int()
	if err != nil {
		return 0, fmt.Errorf("adjust shard %d: %w", shard, err)
	}
	if n == -2 {
		return 0, fmt.Errorf("adjust shard %d: %w", shard, ErrRebuilt)
	}
	return n, nil
}

// Withdraw moves up to units out of a shard's stock (units < 0: gives withdrawn
// units back) for an allocation decrease. It returns the units moved and the
// shard's withdrawn total; total -1 means the shard has no meta. epoch is the
// ledger's epoch the caller read (0: any); see ErrRebuilt.
func (s *Store) Withdraw(ctx context.Context, shard int, epoch, units int64) (moved, total int64, err error) {
	k := s.shards[shard]
	v, err := withdrawScript.Run(ctx, s.rdb, []string{k.Stock(), k.Meta()}, units, epoch).Int64Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("withdraw on shard %d: %w", shard, err)
	}
	if len(v) != 2 {
		return 0, 0, fmt.Errorf("withdraw on shard %d: unexpected reply %v", shard, v)
	}
	if v[1] == -2 {
		return 0, 0, fmt.Errorf("withdraw on shard %d: %w", shard, ErrRebuilt)
	}
	return v[0], v[1], nil
}
