package stock

import (
	"context"
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

// rebuildWipeBatch bounds the reservations one rebuild_begin call deletes.
const rebuildWipeBatch = 1000

// RebuildRestore recreates reservations on shard n, being rebuilt under epoch:
// pending ones (ResReserved) and committed ones (ResCommitted). A committed one
// whose hash would have outlived the backstop TTL since CreatedMs is skipped.
func (s *Store) RebuildRestore(ctx context.Context, n int, epoch int64, rs []Reservation) error {
	k := s.shards[n]
	now := time.Now().UnixMilli()
	// Sized once: a rebuild makes a call per 200 reservations, millions of
	// them, and slices grown by append are garbage the collector pays for.
	keys := make([]string, 2, 2+len(rs))
	keys[0], keys[1] = k.Meta(), k.Index()
	args := make([]any, 1, 1+8*len(rs))
	args[0] = epoch
	restored := 0
	for _, r := range rs {
		// A reservation made under a longer TTL than the campaign's current one
		// still holds its unit until its own expiry: its hash must outlive that.
		ttl := s.backstop
		if left := time.Duration(r.ExpiryMs-now) * time.Millisecond; left > 0 {
			ttl = max(ttl, addCapped(s.backstop, left))
		}
		if r.Status == ResCommitted {
			ttl = s.backstop - time.Duration(now-r.CreatedMs)*time.Millisecond
			if ttl < time.Second {
				continue
			}
		} else if r.Status != ResReserved {
			return fmt.Errorf("restore on shard %d: reservation %s has status %q", n, r.Key, r.Status)
		}
		keys = append(keys, k.Res(r.Key))
		args = append(args, r.Key, r.User, r.Quantity, r.ExpiryMs, r.Epoch, r.Home, r.Status, int64(ttl/time.Second))
		restored++
	}
	if restored == 0 {
		return nil
	}
	got, err := rebuildRestoreScript.Run(ctx, s.rdb, keys, args...).Int()
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
	args := make([]any, 0, 1+len(fields))
	args = append(args, epoch)
	for _, f := range fields {
		args = append(args, f)
	}
	got, err := rebuildUsersScript.Run(ctx, s.rdb, []string{k.Meta(), k.Users(), k.Claims()}, args...).Int()
	if err == nil && got < 0 {
		err = fmt.Errorf("restore users on shard %d: shard is not being rebuilt under epoch %d", n, epoch)
	}
	return err
}

// RebuildFinish writes the stock and then the meta (gate state) of shard n.
func (s *Store) RebuildFinish(ctx context.Context, n int, units, epoch int64, gate string, alloc, lastChange int64) error {
	k := s.shards[n]
	got, err := rebuildFinishScript.Run(ctx, s.rdb, []string{k.Stock(), k.Meta()}, units, epoch, gate, alloc, lastChange).Int()
	if err == nil && got != 1 {
		err = fmt.Errorf("finish shard %d: shard is not being rebuilt under epoch %d", n, epoch)
	}
	return err
}
