package stock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Quota operations on the home shard, for reservations placed on other shards.
const (
	// QuotaRelease: the placed reservation named by shard and expiry was
	// released: its quota goes back.
	QuotaRelease = "release"
	// QuotaForget: the placed reservation named by shard and expiry was sold:
	// the quota stays, its pointer and claims entry go.
	QuotaForget  = "forget"
	quotaConfirm = "confirm" // ConfirmClaim
	quotaUnclaim = "unclaim" // Unclaim
	quotaReap    = "reap"    // ReapClaim
)

// Quota runs quota.lua's release or forget on the user's home shard for the
// reservation of key placed on shard with expiryMs; any other pointer the key
// has there now is left alone. It reports whether it changed anything (false:
// already done, another placement's, or lost with the data).
func (s *Store) Quota(ctx context.Context, home int, op, user, key string, qty int, shard int, expiryMs int64) (bool, error) {
	if err := checkQuotaOp(home, op); err != nil {
		return false, err
	}
	return s.quota(ctx, home, op, user, key, qty, Pointer(shard, expiryMs), "")
}

// checkQuotaOp refuses an operation Quota does not know.
func checkQuotaOp(home int, op string) error {
	if op != QuotaRelease && op != QuotaForget {
		return fmt.Errorf("quota on shard %d: unknown operation %q", home, op)
	}
	return nil
}

// QuotaGive is one Quota call of QuotaEach.
type QuotaGive struct {
	Op, User, Key string
	Quantity      int
	Shard         int // where the reservation was placed
	ExpiryMs      int64
}

// QuotaEach is Quota of each of gives on the home shard, in pipelines as
// ReleaseEach sends its calls: the sweeper's give-back of the quota of the
// stolen reservations it released. changed[i] and errs[i] are gives[i]'s.
func (s *Store) QuotaEach(ctx context.Context, home int, gives []QuotaGive) (changed []bool, errs []error) {
	changed = make([]bool, len(gives))
	for _, g := range gives {
		if err := checkQuotaOp(home, g.Op); err != nil {
			errs = make([]error, len(gives))
			for i := range errs {
				errs[i] = err
			}
			return changed, errs
		}
	}
	k := s.shards[home]
	replies, errs := s.eachOn(ctx, home, quotaScript, len(gives),
		func(i int) ([]string, []any) {
			g := gives[i]
			return []string{k.Users(), k.Claims()}, []any{g.Op, g.User, g.Key, g.Quantity, Pointer(g.Shard, g.ExpiryMs), ""}
		},
		func(i int) (any, error) {
			g := gives[i]
			return s.Quota(ctx, home, g.Op, g.User, g.Key, g.Quantity, g.Shard, g.ExpiryMs)
		})
	for i := range gives {
		switch r := replies[i].(type) {
		case bool: // sent again alone, its error already says so
			changed[i] = r
		default:
			n, _ := r.(int64)
			changed[i] = n == 1
			if errs[i] != nil {
				errs[i] = fmt.Errorf("quota %s on shard %d: %w", gives[i].Op, home, errs[i])
			}
		}
	}
	return changed, errs
}

func (s *Store) quota(ctx context.Context, home int, op, user, key string, qty int, ptr, claim string) (bool, error) {
	k := s.shards[home]
	n, err := quotaScript.Run(ctx, s.rdb, []string{k.Users(), k.Claims()}, op, user, key, qty, ptr, claim).Int()
	if err != nil {
		return false, fmt.Errorf("quota %s on shard %d: %w", op, home, err)
	}
	return n == 1, nil
}

// ConfirmClaim turns the claim of key on the home shard into the pointer of
// the reservation placed on shard with expiryMs, if the claim is still the one
// claim names (the Status of the reserve script's CLAIMED answer).
func (s *Store) ConfirmClaim(ctx context.Context, home int, key, claim string, shard int, expiryMs int64) (bool, error) {
	return s.quota(ctx, home, quotaConfirm, "", key, 0, Pointer(shard, expiryMs), claim)
}

// Unclaim gives back the claim of key on the home shard if it is still the
// one claim names: no shard had stock for it.
func (s *Store) Unclaim(ctx context.Context, home int, key, claim string) (bool, error) {
	return s.quota(ctx, home, quotaUnclaim, "", key, 0, "", claim)
}

// StaleClaims lists up to limit keys of claims made on shard at or before
// cutoff, oldest first, past the first offset: quota claimed for stealing
// whose placing process may have died.
func (s *Store) StaleClaims(ctx context.Context, shard int, cutoff time.Time, offset, limit int) ([]string, error) {
	keys, err := s.rdb.ZRangeByScore(ctx, s.shards[shard].Claims(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(cutoff.UnixMilli(), 10), Offset: int64(offset), Count: int64(limit),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("claims of shard %d: %w", shard, err)
	}
	return keys, nil
}

// ReapClaim gives back the quota of the claim of key on shard when it was made
// at or before cutoff and is still a claim (its reservation was never confirmed
// placed), and reports whether it did. A claim given back meanwhile only leaves
// the claims index. For a claim whose reservation was confirmed placed it
// changes nothing and returns the reservation's shard: the caller asks the
// ledger whether to give the quota back (QuotaRelease) or keep it (QuotaForget).
func (s *Store) ReapClaim(ctx context.Context, shard int, key string, cutoff time.Time) (reaped bool, placedOn int, err error) {
	reaped, placed, err := s.ReapClaimAt(ctx, shard, key, cutoff)
	return reaped, placed.Shard, err
}

// ReapClaimAt is ReapClaim that returns the whole pointer of a placed
// reservation (Shard -1 when there is none): its shard and expiry name it for
// Quota, and its buyer and quantity say whose quota it holds.
func (s *Store) ReapClaimAt(ctx context.Context, shard int, key string, cutoff time.Time) (reaped bool, placed Placement, err error) {
	none := Placement{Shard: -1}
	k := s.shards[shard]
	v, err := quotaScript.Run(ctx, s.rdb, []string{k.Users(), k.Claims()}, quotaReap, "", key, 0, cutoff.UnixMilli(), "").Slice()
	if err != nil {
		return false, none, fmt.Errorf("reap claim on shard %d: %w", shard, err)
	}
	if len(v) < 2 {
		return false, none, fmt.Errorf("reap claim on shard %d: unexpected reply %v", shard, v)
	}
	if toInt(v[0]) != 2 {
		return toInt(v[0]) == 1, none, nil
	}
	if len(v) != 3 {
		return false, none, fmt.Errorf("reap claim on shard %d: unexpected reply %v", shard, v)
	}
	placed, err = parsePlacement(toString(v[1]), toString(v[2]), len(s.shards))
	if err != nil {
		return false, none, fmt.Errorf("reap claim on shard %d: %w", shard, err)
	}
	return false, placed, nil
}
