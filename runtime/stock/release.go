package stock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ReleaseCode is the outcome of release.lua and cancel.lua.
type ReleaseCode int

const (
	NotFound    ReleaseCode = 0
	Released    ReleaseCode = 1
	NotReserved ReleaseCode = 2 // committed
	WrongUser   ReleaseCode = 3
	Rebuilding  ReleaseCode = 4
	// LedgerNeeded: the reservation's hash is gone but its expiry-index entry
	// says its units were never given back: call ReleaseFromLedger.
	LedgerNeeded ReleaseCode = 5
	// NotThis: the reservation's hash is another placement of the same
	// request than the one named (ReleasePlaced); nothing changed.
	NotThis ReleaseCode = 6
)

// ReleaseResult says what a release did; when Home differs from the shard, the
// caller gives the user's quota back on the home shard (Quota with QuotaRelease).
type ReleaseResult struct {
	Code     ReleaseCode
	User     string
	Quantity int
	Home     int
	ExpiryMs int64 // the reservation's: with its shard, it names its home pointer
}

// Release gives a reserved reservation's units back, once.
func (s *Store) Release(ctx context.Context, shard int, key string) (ReleaseResult, error) {
	return s.release(ctx, releaseScript, shard, key, "", "", "", "", "", "")
}

// ReleasePlaced is Release of the placement made at expiryMs in epoch only:
// the give-back of a request that could not record its reservation. Its key
// is the request's, so a retry of the request may have placed another
// reservation under it since (after a rebuild, or once this one was
// settled) and been answered "reserved"; that one is left alone (NotThis).
func (s *Store) ReleasePlaced(ctx context.Context, shard int, key string, expiryMs, epoch int64) (ReleaseResult, error) {
	return s.release(ctx, releaseScript, shard, key, "", "", "", "", expiryMs, epoch)
}

// ReleaseFromLedger is Release for a reservation whose hash is gone (it
// outlived the hash's backstop TTL): the ledger row's quantity, expiry and user
// say what to give back, and its expiry-index entry, if still there with that
// expiry, that it was never given back. qty 0 (no ledger row) only drops the
// index entry. A hash there again (a retry placed since l was listed) is
// another placement: NotThis, nothing changed.
func (s *Store) ReleaseFromLedger(ctx context.Context, shard int, l Listed, qty int, expiryMs int64, user string) (ReleaseResult, error) {
	return s.release(ctx, releaseScript, shard, l.Key, qty, expiryMs, user, HomeShard(user, len(s.shards)), l.ExpiryMs, "")
}

// Listed is a reservation key as the expiry index lists it, with the
// expiry it is listed at.
type Listed struct {
	Key      string
	ExpiryMs int64
}

// ReleaseListed is Release of the placement l was listed for: a hash of
// another placement of the key (a retry's, placed since) is NotThis, and
// nothing changes.
func (s *Store) ReleaseListed(ctx context.Context, shard int, l Listed) (ReleaseResult, error) {
	return s.release(ctx, releaseScript, shard, l.Key, l.args()...)
}

// args are release.lua's ARGV[3..8] for l: no ledger row, the expiry listed,
// any epoch.
func (l Listed) args() []any { return []any{"", "", "", "", l.ExpiryMs, ""} }

// fenceSeconds is release.lua's ARGV[9] and cancel.lua's ARGV[4]: how long
// the fences a released reservation's hash still holds are kept.
var fenceSeconds = seconds(FenceTTL)

// seconds is d in whole seconds, as EXPIRE takes it.
func seconds(d time.Duration) int64 { return int64(d / time.Second) }

// Cancel is Release for the reservation's own user only.
func (s *Store) Cancel(ctx context.Context, shard int, key, user string) (ReleaseResult, error) {
	return s.release(ctx, cancelScript, shard, key, user)
}

// release runs script (release.lua with its ARGV[3..8], cancel.lua with its
// ARGV[3]); the fences' lifetime is appended.
func (s *Store) release(ctx context.Context, script script, shard int, key string, extra ...any) (ReleaseResult, error) {
	k := s.shards[shard]
	args := append(append([]any{key, shard}, extra...), fenceSeconds)
	v, err := script.Run(ctx, s.rdb, []string{k.Stock(), k.Meta(), k.Index(), k.Res(key), k.Users()}, args...).Slice()
	return releaseReply(shard, v, err)
}

// ReleaseBatch is the most release calls ReleaseEach sends in one pipeline.
// The server runs a pipeline's calls back to back (about 15 µs each), so a
// larger one would hold the reserve calls queued behind it for longer than
// one of the reserve pods' own pipelines does (32 calls).
const ReleaseBatch = 32

// ReleaseEach is ReleaseListed of each of listed on shard, ReleaseBatch
// calls to a pipeline to the shard's server (see eachOn): a sweep of expired
// reservations pays a round trip per pipeline, not per reservation.
// results[i] and errs[i] are listed[i]'s.
func (s *Store) ReleaseEach(ctx context.Context, shard int, listed []Listed) (results []ReleaseResult, errs []error) {
	results = make([]ReleaseResult, len(listed))
	k := s.shards[shard]
	replies, errs := s.eachOn(ctx, shard, releaseScript, len(listed),
		func(i int) ([]string, []any) {
			l := listed[i]
			return []string{k.Stock(), k.Meta(), k.Index(), k.Res(l.Key), k.Users()}, append(append([]any{l.Key, shard}, l.args()...), fenceSeconds)
		},
		func(i int) (any, error) { return s.ReleaseListed(ctx, shard, listed[i]) })
	for i := range listed {
		switch r := replies[i].(type) {
		case ReleaseResult: // sent again alone
			results[i] = r
		default:
			results[i], errs[i] = releaseReply(shard, r, errs[i])
		}
	}
	return results, errs
}

// eachOn runs n calls of sc on the server holding shard, ReleaseBatch to a
// pipeline; call(i) is the i-th call's keys and arguments. Each call is
// sent once. Calls answered NOSCRIPT (the server restarted or failed over)
// go again, pipelined, once the script is loaded; calls redirected (MOVED,
// ASK: the slot moved) go again through alone(i), on their own, through the
// cluster client, which follows them: neither had run. Otherwise replies[i]
// is the i-th call's reply (a []any), or alone's answer, and errs[i] its
// error: after a lost reply, the call and those behind it in its pipeline,
// whose replies were never read, may have run, and the caller looks again
// later. Once a pipeline goes unanswered (a read timeout: the server stalls)
// the later ones are not sent, each of which would wait as long: their
// calls fail with ErrNotSent and did not run; calls answered NOSCRIPT are
// not sent again either.
func (s *Store) eachOn(ctx context.Context, shard int, sc script, n int,
	call func(i int) ([]string, []any), alone func(i int) (any, error)) (replies []any, errs []error) {
	replies, errs = make([]any, n), make([]error, n)
	if n == 0 {
		return replies, errs
	}
	node, err := s.node(ctx, s.shards[shard].Meta())
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return replies, errs
	}
	cmds := make([]*redis.Cmd, n)
	var unanswered error
	send := func(which []int) {
		for start := 0; start < len(which); start += ReleaseBatch {
			pipe := node.Pipeline()
			chunk := which[start:min(start+ReleaseBatch, len(which))]
			for _, i := range chunk {
				keys, args := call(i)
				cmds[i] = evalCmd(ctx, "evalsha", sc.sha1, keys, args)
				if unanswered != nil {
					cmds[i].SetErr(fmt.Errorf("%w: an earlier pipeline to the server went unanswered: %w", ErrNotSent, unanswered))
					continue
				}
				_ = pipe.Process(ctx, noRetryCmd{cmds[i]})
			}
			if unanswered != nil {
				continue
			}
			_, _ = pipe.Exec(ctx) // the calls' errors are read one by one below
			for _, i := range chunk {
				if err := cmds[i].Err(); !serverAnswered(err) {
					unanswered = err
					break
				}
			}
		}
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	send(all)
	var unloaded []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			unloaded = append(unloaded, i)
		}
	}
	if len(unloaded) > 0 && unanswered == nil && node.ScriptLoad(ctx, sc.src).Err() == nil {
		send(unloaded)
	}
	for i, cmd := range cmds {
		err := cmd.Err()
		s.redirected(ctx, err) // a moved slot or a lost server: reload the slot map (lazily, once)
		if redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") {
			replies[i], errs[i] = alone(i)
			continue
		}
		replies[i], errs[i] = cmd.Val(), err
	}
	return replies, errs
}

func releaseReply(shard int, reply any, err error) (ReleaseResult, error) {
	v, _ := reply.([]any)
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("release on shard %d: %w", shard, err)
	}
	if len(v) != 5 {
		return ReleaseResult{}, fmt.Errorf("release on shard %d: unexpected reply %v", shard, v)
	}
	return ReleaseResult{Code: ReleaseCode(toInt(v[0])), User: toString(v[1]), Quantity: int(toInt(v[2])), Home: int(toInt(v[3])), ExpiryMs: toInt(v[4])}, nil
}

// Expired lists up to limit reservation keys of a shard whose expiry is at or before
// beforeMs (Redis clock), with that expiry, earliest first, past the first offset.
func (s *Store) Expired(ctx context.Context, shard int, beforeMs int64, offset, limit int) ([]Listed, error) {
	zs, err := s.rdb.ZRangeByScoreWithScores(ctx, s.shards[shard].Index(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(beforeMs, 10), Offset: int64(offset), Count: int64(limit),
	}).Result()
	out := make([]Listed, len(zs))
	for i, z := range zs {
		key, _ := z.Member.(string)
		out[i] = Listed{Key: key, ExpiryMs: int64(z.Score)}
	}
	return out, err
}

// serverAnswered reports whether err is the server's own answer (a script
// or command error), or none: not a timeout, a closed connection or an
// ended context.
func serverAnswered(err error) bool {
	var reply redis.Error
	return err == nil || errors.As(err, &reply)
}
