package engine_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// lostReply is a failpoint on a Redis client: the next commands it is armed
// for run on the server, and then their caller gets a read timeout as if the
// reply had been lost on the way back. Add it with stock.AddHook before the
// client's first command.
type lostReply struct {
	mu    sync.Mutex
	match func(args []any) bool
	left  int  // replies still to lose
	lost  int  // replies lost so far
	drop  bool // lose the command itself: it never reaches the server
	hold  bool // with drop: keep the command, for the test to send late
	held  [][]any
	// tail: a reply lost in a pipeline loses the replies behind it too, as
	// a broken connection does (they ran, and were never read).
	tail bool
}

// errLostReply is what a reply lost to a read deadline looks like to a caller.
var errLostReply error = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}

// arm loses the replies of the next n commands matching match.
func (h *lostReply) arm(n int, match func(args []any) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.match, h.left, h.drop, h.tail = match, n, false, false
}

// armTail is arm for replies lost in a pipeline with every reply behind
// them in it.
func (h *lostReply) armTail(n int, match func(args []any) bool) {
	h.arm(n, match)
	h.mu.Lock()
	h.tail = true
	h.mu.Unlock()
}

// armDrop is arm for commands lost on the way to the server: they do not run.
func (h *lostReply) armDrop(n int, match func(args []any) bool) {
	h.arm(n, match)
	h.mu.Lock()
	h.drop = true
	h.mu.Unlock()
}

// armHold is armDrop for commands held on the way: the test sends them
// later (sendHeld), as a stalled server runs what it had read.
func (h *lostReply) armHold(n int, match func(args []any) bool) {
	h.armDrop(n, match)
	h.mu.Lock()
	h.hold = true
	h.mu.Unlock()
}

// sendHeld sends the held commands, now, through rdb: their replies.
func (h *lostReply) sendHeld(ctx context.Context, rdb redis.UniversalClient) []*redis.Cmd {
	h.mu.Lock()
	held := h.held
	h.held, h.hold = nil, false
	h.mu.Unlock()
	out := make([]*redis.Cmd, 0, len(held))
	for _, args := range held {
		out = append(out, rdb.Do(ctx, args...))
	}
	return out
}

// count is how many replies were lost.
func (h *lostReply) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

// take reports whether this command is lost: before it is sent (before,
// when armed to drop commands) or after it ran without error (its reply).
func (h *lostReply) take(args []any, before bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.drop != before || h.left == 0 || h.match == nil || !h.match(args) {
		return false
	}
	h.left--
	h.lost++
	if h.hold {
		h.held = append(h.held, append([]any(nil), args...))
	}
	return true
}

func (h *lostReply) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook does the same to the commands of a pipeline (reserve
// calls batched with FLASHSALE_TEST_RESERVE_PIPELINE), each on its own.
func (h *lostReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		send := cmds[:0:0]
		for _, cmd := range cmds {
			if h.take(cmd.Args(), true) {
				cmd.SetErr(errLostReply)
				continue
			}
			send = append(send, cmd)
		}
		var err error
		if len(send) > 0 {
			err = next(ctx, send)
		}
		h.mu.Lock()
		tail := h.tail
		h.mu.Unlock()
		lostBefore := false
		for _, cmd := range send {
			if lostBefore || cmd.Err() == nil && h.take(cmd.Args(), false) {
				cmd.SetErr(errLostReply)
				err = errLostReply
				lostBefore = tail
			}
		}
		if len(send) < len(cmds) && err == nil {
			err = errLostReply
		}
		return err
	}
}

func (h *lostReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.take(cmd.Args(), true) {
			cmd.SetErr(errLostReply)
			return errLostReply
		}
		err := next(ctx, cmd)
		if err == nil && h.take(cmd.Args(), false) {
			cmd.SetErr(errLostReply)
			return errLostReply
		}
		return err
	}
}

// isReserveMode matches a reserve script call in the given mode (its
// ARGV[8]): EVALSHA sha numkeys keys... args...
func isReserveMode(mode stock.Mode) func(args []any) bool {
	return func(args []any) bool {
		if len(args) < 3 {
			return false
		}
		name, _ := args[0].(string)
		nkeys, _ := strconv.Atoi(fmt.Sprint(args[2]))
		if len(args) < 3+nkeys+8 {
			return false
		}
		m, _ := args[3+nkeys+7].(string)
		return strings.HasPrefix(strings.ToLower(name), "eval") && m == string(mode)
	}
}

// withLostReplies is a client of backend b with a lostReply failpoint on it.
// Neither client re-sends a command after an error (the cluster client's
// MaxRedirects would, on a network error): the engine itself resolves what
// a lost reply leaves behind.
func withLostReplies(t *testing.T, b backend) (redis.UniversalClient, *lostReply) {
	var rdb redis.UniversalClient
	switch b.name {
	case "cluster":
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: sharedCluster.Addrs(), PoolSize: 64, MaxRedirects: -1})
		t.Cleanup(func() { _ = c.Close() })
		rdb = c
	default:
		rdb = b.client(t) // MaxRetries: -1
	}
	h := &lostReply{}
	stock.AddHook(rdb, h)
	return rdb, h
}

// assertQuotaCovers checks, from the reservation hashes themselves, that every
// unit a user holds in Redis (reserved or sold) is counted by the user's
// quota on the home shard, and that every reservation placed on another shard
// is the one its home pointer names (shard and expiry): otherwise a retry of
// the same request could take another unit, and a give-back meant for one
// reservation could land on another.
func (f *fixture) assertQuotaCovers() {
	f.t.Helper()
	ctx := context.Background()
	s := f.e.Store()
	held := map[string]int64{}
	for i := 0; i < s.Shards(); i++ {
		k := s.Keys(i)
		for _, hashKey := range scanKeys(f.t, f.rdb, k.ResPrefix()+"*") {
			key := strings.TrimPrefix(hashKey, k.ResPrefix())
			r, ok, err := s.GetReservation(ctx, i, key)
			if err != nil {
				f.t.Fatal(err)
			}
			if !ok || r.Status != stock.ResReserved {
				continue // sold units may outlive their pointers; their quota stays
			}
			held[r.User] += int64(r.Quantity)
			if r.Home == i {
				continue
			}
			ptr, err := f.rdb.HGet(ctx, s.Keys(r.Home).Users(), "p:"+key).Result()
			if want := stock.Pointer(i, r.ExpiryMs); err != nil || ptr != want {
				f.t.Fatalf("reservation %s of %s on shard %d: home shard %d points at %q (%v), want %q",
					key, r.User, i, r.Home, ptr, err, want)
			}
		}
	}
	for user, n := range held {
		home := stock.HomeShard(user, s.Shards())
		q, err := f.rdb.HGet(ctx, s.Keys(home).Users(), user).Int64()
		if err != nil || q < n {
			f.t.Fatalf("%s holds %d reserved units in Redis, its quota on shard %d counts %d (%v)", user, n, home, q, err)
		}
	}
}

// isScript matches a call of the named script of runtime/stock/scripts: by its
// SHA1 (EVALSHA), or by its body (EVAL, after a NOSCRIPT).
func isScript(t testing.TB, name string) func(args []any) bool {
	t.Helper()
	src := scriptSource(t, name)
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	return func(args []any) bool {
		if len(args) < 2 {
			return false
		}
		switch strings.ToLower(fmt.Sprint(args[0])) {
		case "evalsha":
			return fmt.Sprint(args[1]) == sha
		case "eval":
			return fmt.Sprint(args[1]) == src
		}
		return false
	}
}

// scriptSource is the body of the named script of runtime/stock/scripts.
func scriptSource(t testing.TB, name string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(testharness.RepoRoot(), "runtime", "stock", "scripts", name+".lua"))
	if err != nil {
		t.Fatal(err)
	}
	return string(src)
}
