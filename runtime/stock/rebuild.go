package stock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// RebuildBegin closes shard n for a rebuild under the new epoch and wipes it.
func (s *Store) RebuildBegin(ctx context.Context, n int, epoch int64) error {
	k := s.shards[n]
	keys := []string{k.Stock(), k.Meta(), k.Index(), k.Users(), k.Claims()}
	for {
		left, err := rebuildBeginScript.Run(ctx, s.rdb, keys, epoch, k.ResPrefix(), rebuildWipeBatch).Int64()
		if err != nil || left == 0 {
			return err
		}
	}
}

// ErrRebuildServerChanged: the server process finishing a shard's rebuild is
// not the one that began it (a restart from a snapshot or an AOF, or a
// replica promoted, in between). The shard stays closed; a rebuild at a new
// epoch starts over on it.
var ErrRebuildServerChanged = errors.New("the Redis server holding the shard changed during the rebuild")

// rebuildWipeBatch bounds the reservations one rebuild_begin call deletes.
const rebuildWipeBatch = 1000

// RebuildRestore recreates reservations on shard n, being rebuilt under epoch:
// pending ones (ResReserved), whose hashes have no TTL, and committed ones
// (ResCommitted). A committed one whose hash would have outlived the backstop
// TTL since CreatedMs is skipped.
func (s *Store) RebuildRestore(ctx context.Context, n int, epoch int64, rs []Reservation) error {
	k := s.shards[n]
	now := time.Now().UnixMilli()
	// Each committed reservation's hash TTL, in seconds (0 for a pending
	// one); skipped: not restored.
	const skipped = -1
	ttls := make([]int64, len(rs))
	restored := 0
	for i, r := range rs {
		switch r.Status {
		case ResReserved:
		case ResCommitted:
			ttl := s.backstop - time.Duration(now-r.CreatedMs)*time.Millisecond
			if ttl < time.Second {
				ttls[i] = skipped
				continue
			}
			ttls[i] = seconds(ttl)
		default:
			return fmt.Errorf("restore on shard %d: reservation %s has status %q", n, r.Key, r.Status)
		}
		restored++
	}
	if restored == 0 {
		return nil
	}
	// Built in the command's own slice: a rebuild makes a call per 200
	// reservations, millions of them.
	args := newEvalArgs(2+restored, 1+8*restored)
	args = append(args, k.Meta(), k.Index())
	for i, r := range rs {
		if ttls[i] != skipped {
			args = append(args, k.Res(r.Key))
		}
	}
	args = append(args, epoch)
	for i, r := range rs {
		if ttls[i] != skipped {
			args = append(args, r.Key, r.User, r.Quantity, r.ExpiryMs, r.Epoch, r.Home, r.Status, ttls[i])
		}
	}
	got, err := rebuildRestoreScript.runArgs(ctx, s.rdb, 2+restored, args).Int()
	if err == nil && got != restored {
		err = fmt.Errorf("restore on shard %d: shard is not being rebuilt under epoch %d", n, epoch)
	}
	return err
}

// RebuildUsers restores users-hash fields (field, value pairs) on shard n,
// being rebuilt under epoch.
func (s *Store) RebuildUsers(ctx context.Context, n int, epoch int64, fields []string) error {
	if len(fields) == 0 {
		return nil
	}
	k := s.shards[n]
	args := newEvalArgs(3, 1+len(fields))
	args = append(args, k.Meta(), k.Users(), k.Claims(), epoch)
	for _, f := range fields {
		args = append(args, f)
	}
	got, err := rebuildUsersScript.runArgs(ctx, s.rdb, 3, args).Int()
	if err == nil && got < 0 {
		err = fmt.Errorf("restore users on shard %d: shard is not being rebuilt under epoch %d", n, epoch)
	}
	return err
}

// RebuildFinish writes the stock and then the meta (gate state) of shard n.
func (s *Store) RebuildFinish(ctx context.Context, n int, units, epoch int64, gate string, alloc, lastChange int64) error {
	k := s.shards[n]
	got, err := rebuildFinishScript.Run(ctx, s.rdb, []string{k.Stock(), k.Meta()}, units, epoch, gate, alloc, lastChange).Int()
	switch {
	case err != nil:
	case got == -2:
		err = fmt.Errorf("finish shard %d: %w: it holds what a snapshot or a replica kept of the rebuild, not all of it", n, ErrRebuildServerChanged)
	case got != 1:
		err = fmt.Errorf("finish shard %d: shard is not being rebuilt under epoch %d", n, epoch)
	}
	return err
}
