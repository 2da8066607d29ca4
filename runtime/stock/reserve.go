package stock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Code is the outcome of one reserve script call on one shard.
type Code int

const (
	Reserved Code = 1
	Replay   Code = 2
	SoldOut  Code = 3
	Limit    Code = 4
	Closed   Code = 5
	Claimed  Code = 6
	Busy     Code = 7
)

func (c Code) String() string {
	switch c {
	case Reserved:
		return "RESERVED"
	case Replay:
		return "REPLAY"
	case SoldOut:
		return "SOLD_OUT"
	case Limit:
		return "LIMIT"
	case Closed:
		return "CLOSED"
	case Claimed:
		return "CLAIMED"
	case Busy:
		return "BUSY"
	}
	return "CODE_" + strconv.Itoa(int(c))
}

// Mode tells the reserve script which part of the per-user logic runs on this shard.
type Mode string

const (
	ModeHome  Mode = "home"  // the user's home shard, no stealing
	ModeClaim Mode = "claim" // home shard; on sold out, claim the quota for stealing
	ModeSteal Mode = "steal" // another shard; the quota was claimed on the home shard
)

// ShardResult is what the reserve script said.
type ShardResult struct {
	Code     Code
	ExpiryMs int64 // Redis clock, ms since the Unix epoch
	Epoch    int64 // the shard's epoch
	// Extra: stock left (Reserved), shard (Replay, -1 = this one), units the
	// user holds (Limit, SoldOut, Claimed).
	Extra int64
	// Status: R/C (Replay), the closed reason (Closed), or the claim's stamp
	// (Claimed), which ConfirmClaim and Unclaim name.
	Status string
}

// ReserveRequest is one reserve script call.
type ReserveRequest struct {
	Shard, Home int
	Mode        Mode
	User, Key   string
	Quantity    int
	MaxPerUser  int
	TTL         time.Duration
	MinEpoch    int64
	// Attempt tags this call's attempt (letters and digits, no '|' or '.'):
	// its claim's stamp carries it, so that Resolve can tell this attempt's
	// own claim after a lost reply, and fence the call if it has not run.
	Attempt string
}

// Reserve runs the reserve script on one shard.
func (s *Store) Reserve(ctx context.Context, r ReserveRequest) (ShardResult, error) {
	k := s.shards[r.Shard]
	v, err := s.runReserve(ctx, k.Meta(),
		[]string{k.Stock(), k.Meta(), k.Index(), k.Res(r.Key), k.Users(), k.Claims()},
		r.User, r.Key, r.Quantity, r.MaxPerUser, r.TTL.Milliseconds(),
		"", r.MinEpoch, string(r.Mode), r.Home, r.Attempt,
	)
	if err != nil {
		return ShardResult{}, fmt.Errorf("reserve on shard %d: %w", r.Shard, err)
	}
	if len(v) != 5 {
		return ShardResult{}, fmt.Errorf("reserve on shard %d: unexpected reply %v", r.Shard, v)
	}
	return ShardResult{
		Code:     Code(toInt(v[0])),
		ExpiryMs: toInt(v[1]),
		Epoch:    toInt(v[2]),
		Extra:    toInt(v[3]),
		Status:   toString(v[4]),
	}, nil
}

// runReserve runs the reserve script on the server holding key, as loaded for
// that server process (see reserve.lua). It runs on that server's own client,
// never through cluster redirections, so a body never runs on another server
// than the one it was loaded for. NOSCRIPT means a new server process (or
// SCRIPT FLUSH): the script is loaded again for the run id the server has now.
func (s *Store) runReserve(ctx context.Context, key string, keys []string, args ...any) ([]any, error) {
	node, err := s.node(ctx, key)
	if err != nil {
		return nil, err
	}
	srv := s.server(node.Options().Addr)
	cur := srv.loaded.Load()
	if cur == nil {
		cur, err = s.loadReserve(ctx, node, srv, nil)
	}
	var v []any
	if err == nil {
		v, err = s.evalReserve(ctx, node, srv, cur, keys, args)
	}
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Answered before the script ran, in a pipeline as alone: the
		// call after the load is its first run.
		if cur, err = s.loadReserve(ctx, node, srv, cur); err == nil {
			v, err = s.evalReserve(ctx, node, srv, cur, keys, args)
		}
	}
	s.redirected(ctx, err) // a failed load too: the node may be gone
	return v, err
}

// evalReserve is one EVALSHA of the reserve body loaded as cur: in the next
// pipeline to the server when batching is on, else on its own. Either way it
// is sent once (noRetryCmd).
func (s *Store) evalReserve(ctx context.Context, node *redis.Client, srv *serverScript, cur *loadedScript, keys []string, args []any) ([]any, error) {
	sha := ReserveScriptFor(cur.runID).Hash()
	if !s.pipeline.Enabled() {
		return evalShaOnce(ctx, node, sha, keys, args...).Slice()
	}
	return srv.batch.do(ctx, s.pipeline, node, evalCmd(ctx, "evalsha", sha, keys, args))
}
