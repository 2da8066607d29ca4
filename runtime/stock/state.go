package stock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Unverified lists the shards of states (from State) whose meta was written
// by another server process than the one holding them now, or under another
// replication history (see reserve.lua): restarted from a snapshot, a replica
// promoted by a failover, or a master promoted back after one. Their stock
// may be older than the ledger; the reserve script refuses them until they are
// rebuilt.
func Unverified(states []ShardState) []int {
	var out []int
	for _, st := range states {
		if st.Unverified {
			out = append(out, st.Index)
		}
	}
	return out
}

// Now is the Redis server's clock, the one expiries are measured with. On a
// Redis Cluster it is any master's: EachShardClock reads the shards' own.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	return s.rdb.Time(ctx).Result()
}

// EachShardClock reads the clock of each shard's server, the one that wrote
// its reservations' expiries, its paying marks and its claims' times: once
// per server, the servers at once. fn gets each server's shards with its
// clock as soon as that server answers, or with the error (naming the
// server) when it does not, so that a stalled server holds back its own
// shards only, and costs its read timeout once, not once for each shard it
// holds. fn runs on one goroutine per server (on the caller's, with every
// shard, when the servers could not be looked up); EachShardClock returns
// once every call of fn has.
func (s *Store) EachShardClock(ctx context.Context, fn func(shards []int, now time.Time, err error)) {
	held, err := s.shardsByServer(ctx)
	if err != nil {
		// The cluster's slot map is not there: no shard's server is known.
		all := make([]int, len(s.shards))
		for i := range all {
			all[i] = i
		}
		fn(all, time.Time{}, err)
		return
	}
	var wg sync.WaitGroup
	for _, h := range held {
		wg.Go(func() {
			now, err := h.node.Time(ctx).Result()
			if err != nil {
				s.redirected(ctx, err)
				err = fmt.Errorf("time of %s: %w", h.node.Options().Addr, err)
			}
			fn(h.shards, now, err)
		})
	}
	wg.Wait()
}

// ShardState is what a shard holds right now.
type ShardState struct {
	Index      int
	Present    bool // the meta exists; false after Redis lost its data
	State      string
	Epoch      int64
	Available  int64 // stock
	Reserved   int64 // units in RESERVED reservations
	Allocation int64 // units given to this shard (seed + changes)
	LastChange int64
	Withdrawn  int64 // units taken out of stock for an allocation decrease not yet settled
	// WindowStart and WindowEnd are the sale's schedule the reserve script
	// enforces by the Redis clock (SetWindow), in ms since the epoch; 0: none.
	WindowStart, WindowEnd int64
	Server                 string // run id of the server the shard was seeded or rebuilt on ("": not recorded)
	Lineage                string // that server's master_replid then ("": not recorded)
	// Unverified: the meta names another server process than the one holding
	// the shard now, or another replication history of it (its run id and
	// master_replid read by State), so the reserve script refuses it (see
	// reserve.lua). A meta that records no server is never unverified.
	Unverified bool
}

// windowMs is t as a shard's meta records a window edge: ms since the
// epoch, 0 for none (the zero time).
func windowMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// HasWindow reports whether the shard's meta holds this schedule (zero
// times: no bound), as SetWindow writes it.
func (st ShardState) HasWindow(start, end time.Time) bool {
	return st.WindowStart == windowMs(start) && st.WindowEnd == windowMs(end)
}

// OutsideWindow is how the reserve script refuses at now by the shard's
// window (reserve.lua's outside): StateEnded past its end, StateNotStarted
// before its start, "" inside it.
func (st ShardState) OutsideWindow(now time.Time) string {
	switch ms := now.UnixMilli(); {
	case st.WindowEnd != 0 && ms >= st.WindowEnd:
		return StateEnded
	case ms < st.WindowStart:
		return StateNotStarted
	}
	return ""
}

// State reads every shard's stock and meta in one pipeline, then the run id and
// master_replid of each server holding a meta that records one (one INFO per server): cheap
// enough to run every few seconds during a storm.
func (s *Store) State(ctx context.Context) ([]ShardState, error) {
	pipe := s.rdb.Pipeline()
	stocks := make([]*redis.StringCmd, len(s.shards))
	metas := make([]*redis.SliceCmd, len(s.shards))
	for i, k := range s.shards {
		stocks[i] = pipe.Get(ctx, k.Stock())
		metas[i] = pipe.HMGet(ctx, k.Meta(), "state", "epoch", "rsv", "alloc", "chg", "wd", "srv", "lin", "ws", "we")
	}
	// Exec returns the first command's error only: a stock key that is
	// absent (redis.Nil) must not hide a shard whose server did not answer,
	// which would then read as a shard that lost its data.
	_, _ = pipe.Exec(ctx)
	out := make([]ShardState, len(s.shards))
	for i := range s.shards {
		if err := stocks[i].Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		if err := metas[i].Err(); err != nil {
			return nil, err
		}
		st := ShardState{Index: i}
		if v, err := stocks[i].Int64(); err == nil {
			st.Available = v
		}
		m := metas[i].Val()
		if len(m) == 10 && m[0] != nil {
			st.Present = true
			st.State = toString(m[0])
			st.Epoch = atoi64(toString(m[1]))
			st.Reserved = atoi64(toString(m[2]))
			st.Allocation = atoi64(toString(m[3]))
			st.LastChange = atoi64(toString(m[4]))
			st.Withdrawn = atoi64(toString(m[5]))
			st.Server = toString(m[6])
			st.Lineage = toString(m[7])
			st.WindowStart = atoi64(toString(m[8]))
			st.WindowEnd = atoi64(toString(m[9]))
		}
		out[i] = st
	}
	return out, s.verifyServers(ctx, out)
}
