package stock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A give-back that names its placement takes only that one: another
// placement of the same request (a retry's, after a rebuild) is left whole.
func TestReleasePlacedLeavesAnotherPlacement(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := stock.New(rdb, "placed-"+t.Name(), 1)
	if err := seed(5)(ctx, s); err != nil {
		t.Fatal(err)
	}
	placed, err := s.Reserve(ctx, req(stock.ModeHome))
	if err != nil || placed.Code != stock.Reserved {
		t.Fatalf("reserve: %+v %v", placed, err)
	}
	for _, other := range [][2]int64{{placed.ExpiryMs + 1, placed.Epoch}, {placed.ExpiryMs, placed.Epoch + 1}} {
		rr, err := s.ReleasePlaced(ctx, 0, key, other[0], other[1])
		if err != nil || rr.Code != stock.NotThis {
			t.Fatalf("release naming expiry %d epoch %d: %+v %v; want NotThis", other[0], other[1], rr, err)
		}
	}
	if st, err := s.State(ctx); err != nil || st[0].Available != 4 || st[0].Reserved != 1 {
		t.Fatalf("stock after the other placements' give-backs: %+v %v; want 4", st, err)
	}
	rr, err := s.ReleasePlaced(ctx, 0, key, placed.ExpiryMs, placed.Epoch)
	if err != nil || rr.Code != stock.Released || rr.Quantity != 1 {
		t.Fatalf("release of its own placement: %+v %v; want released", rr, err)
	}
	if st, err := s.State(ctx); err != nil || st[0].Available != 5 || st[0].Reserved != 0 {
		t.Fatalf("stock after the give-back: %+v %v; want 5", st, err)
	}
}

// QuotaEach refuses a batch naming an operation it does not know, whole:
// every give gets the error, and none is sent, not even the valid ones.
func TestQuotaEachRefusesAnUnknownOperation(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	s := stock.New(rdb, "quota-each-"+randomID(), 2)
	if err := then(seed(0), reserved(stock.Claimed, stock.ModeClaim), quota("confirm"))(ctx, s); err != nil {
		t.Fatal(err)
	}
	held := func() string {
		t.Helper()
		n, err := rdb.HGet(ctx, s.Keys(0).Users(), user).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return n
	}
	give := stock.QuotaGive{Op: stock.QuotaRelease, User: user, Key: key, Quantity: 1, Shard: 1, ExpiryMs: placedExpiry}
	bad := give
	bad.Op = "give"
	changed, errs := s.QuotaEach(ctx, 0, []stock.QuotaGive{give, bad})
	for i := range 2 {
		if errs[i] == nil || !strings.Contains(errs[i].Error(), `unknown operation "give"`) || changed[i] {
			t.Errorf("give %d: changed %v, %v; want the unknown operation named", i, changed[i], errs[i])
		}
	}
	if n := held(); n != "1" {
		t.Fatalf("the buyer's quota after the refused batch: %q; want 1 (nothing sent)", n)
	}
	changed, errs = s.QuotaEach(ctx, 0, []stock.QuotaGive{give})
	if errs[0] != nil || !changed[0] {
		t.Fatalf("the valid give alone: changed %v, %v", changed[0], errs[0])
	}
	if n := held(); n != "" {
		t.Fatalf("the buyer's quota after the give-back: %q; want none", n)
	}
}

// A batch of calls to a server that stops answering waits for it once: once
// a pipeline goes unanswered the later ones are not sent (each would wait a
// read timeout too), and their calls fail as not sent. CLIENT PAUSE WRITE
// holds the server's scripts before the batch; a hook counts the pipelines
// the client sends. The batch sent again once the server answers releases
// every reservation.
func TestReleaseEachStopsAtAnUnansweredPipeline(t *testing.T) {
	r := testharness.RedisT(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1, ReadTimeout: 200 * time.Millisecond})
	admin := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close(); _ = admin.Close() })
	ctx := context.Background()
	const n = 3*stock.ReleaseBatch + 4
	if err := loadScripts([]string{r.Addr()}); err != nil { // no NOSCRIPT round first
		t.Fatal(err)
	}
	s := openSale(t, rdb, "stall-"+randomID(), 1, 2*n)
	var keys []stock.Listed
	for i := range n {
		user := fmt.Sprintf("buyer-%d", i)
		res, err := reserveHome(ctx, s, user)
		if err != nil || res.Code != stock.Reserved {
			t.Fatalf("reserve %s: %+v %v", user, res, err)
		}
		keys = append(keys, stock.Listed{Key: "k-" + user, ExpiryMs: res.ExpiryMs})
	}
	pipes := &pipelineCount{}
	stock.AddHook(rdb, pipes)
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	_, errs := s.ReleaseEach(ctx, 0, keys)
	if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	if got := pipes.n.Load(); got != 1 {
		t.Fatalf("%d pipelines sent to a server that did not answer the first, want 1", got)
	}
	for i, err := range errs {
		if sent := i < stock.ReleaseBatch; err == nil || sent == errors.Is(err, stock.ErrNotSent) {
			t.Fatalf("call %d: %v; want the first pipeline's %d timed out and the rest not sent", i, err, stock.ReleaseBatch)
		}
	}
	if _, reserved := totals(t, s); reserved < n-stock.ReleaseBatch {
		t.Fatalf("%d units reserved after the stalled batch, want at least the %d never sent", reserved, n-stock.ReleaseBatch)
	}
	results, errs := s.ReleaseEach(ctx, 0, keys)
	for i := range keys {
		if errs[i] != nil || results[i].Code != stock.Released && results[i].Code != stock.NotFound {
			t.Fatalf("call %d sent again: %+v %v", i, results[i], errs[i])
		}
	}
	if avail, reserved := totals(t, s); avail != 2*n || reserved != 0 {
		t.Fatalf("after the batch sent again: %d available, %d reserved; want %d and 0", avail, reserved, 2*n)
	}
}

// pipelineCount counts the pipelines of script calls a client sends.
type pipelineCount struct{ n atomic.Int64 }

func (*pipelineCount) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*pipelineCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *pipelineCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "evalsha" {
			p.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// A sweep's release gives back the placement it listed and only that one: a
// hash of another placement of the key (a retry's, placed after the request
// gave the listed one back) is left whole, pipelined or alone.
func TestReleaseOfAListedPlacementLeavesAnother(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	s := stock.New(rdb, "listed-"+randomID(), 1)
	if err := seed(5)(ctx, s); err != nil {
		t.Fatal(err)
	}
	placed, err := s.Reserve(ctx, req(stock.ModeHome))
	if err != nil || placed.Code != stock.Reserved {
		t.Fatalf("reserve: %+v %v", placed, err)
	}
	earlier := stock.Listed{Key: key, ExpiryMs: placed.ExpiryMs - 1000}
	res, errs := s.ReleaseEach(ctx, 0, []stock.Listed{earlier})
	if errs[0] != nil || res[0].Code != stock.NotThis {
		t.Fatalf("pipelined release of an earlier placement: %+v %v; want NotThis", res[0], errs[0])
	}
	if rr, err := s.ReleaseListed(ctx, 0, earlier); err != nil || rr.Code != stock.NotThis {
		t.Fatalf("release of an earlier placement: %+v %v; want NotThis", rr, err)
	}
	if st, err := s.State(ctx); err != nil || st[0].Available != 4 || st[0].Reserved != 1 {
		t.Fatalf("stock after the earlier placement's releases: %+v %v; want 4 and 1 held", st, err)
	}
	res, errs = s.ReleaseEach(ctx, 0, []stock.Listed{{Key: key, ExpiryMs: placed.ExpiryMs}})
	if errs[0] != nil || res[0].Code != stock.Released {
		t.Fatalf("release of the placement listed: %+v %v; want Released", res[0], errs[0])
	}
	if st, err := s.State(ctx); err != nil || st[0].Available != 5 || st[0].Reserved != 0 {
		t.Fatalf("stock after the release: %+v %v; want 5", st, err)
	}
}
