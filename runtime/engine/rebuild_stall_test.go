package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A rebuild whose ledger stops answering without closing its connections
// (every byte from PostgreSQL swallowed from the moment the rebuild's start
// is recorded) gives up once it made no progress for StallAfter and a new
// connection gets no answer either, with ErrRebuildStalled as a ledger
// failure, instead of holding the closed shards forever; the shards stay
// closed, and the next rebuild on a ledger that answers opens them with
// every unit accounted for.
func TestRebuildGivesUpWhenTheLedgerStalls(t *testing.T) {
	t.Parallel()
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := tenHeld(t, rdb)
	proxy := testharness.FaultProxyT(t, "127.0.0.1:"+strconv.Itoa(sharedPG.Port()))
	dsn := f.l.Pool().Config().ConnString()
	proxied := strings.Replace(dsn, "127.0.0.1:"+strconv.Itoa(sharedPG.Port()), proxy.Addr(), 1)
	if proxied == dsn {
		t.Fatalf("no 127.0.0.1:%d in %s", sharedPG.Port(), dsn)
	}
	l, err := ledger.Open(context.Background(), proxied)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	e := openEngine(t, f.cfg, rdb, l)

	done := make(chan error, 1)
	var begun atomic.Bool
	go func() {
		_, err := e.RebuildWith(context.Background(), engine.RebuildOptions{
			Gate:       func() string { return stock.StateOpen },
			StallAfter: time.Second,
			Begun: func(int64) {
				begun.Store(true)
				if _, err := proxy.Timeout(testharness.Downstream, 0); err != nil {
					t.Error(err)
				}
			},
		})
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		proxy.RemoveAll() // lets the rebuild return before the test ends
		t.Fatalf("the rebuild still waited for the ledger 30 s after it stopped answering (StallAfter 1s); once it answered: %v", <-done)
	}
	t.Logf("the rebuild: %v", err)
	if !begun.Load() {
		t.Fatalf("the rebuild ended before its start was recorded: %v", err)
	}
	if !errors.Is(err, engine.ErrRebuildStalled) || !errors.Is(err, engine.ErrLedger) ||
		!strings.Contains(err.Error(), "a new connection to the ledger did not answer either") {
		t.Fatalf("the rebuild on a stalled ledger: %v; want ErrRebuildStalled, a ledger failure", err)
	}
	proxy.RemoveAll()
	states, err := f.e.Store().State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range states {
		if st.State == stock.StateOpen {
			t.Fatalf("shard %d open after a stalled rebuild: %+v", st.Index, st)
		}
	}

	if _, err := f.e.RebuildWith(context.Background(), engine.RebuildOptions{Gate: func() string { return stock.StateOpen }, StallAfter: time.Minute}); err != nil {
		t.Fatalf("the rebuild once the ledger answers: %v", err)
	}
	if c := f.assertConserved(); c.Reserved != 10 || c.Available != 40 {
		t.Fatalf("after the rebuild: %+v; want 10 reserved and 40 available", c)
	}
}

// A rebuild that waits on a long statement is not stalled while the ledger
// answers a new connection: here its start waits 3 s for the campaign's row,
// held by another transaction, with StallAfter 1 s, and then completes.
func TestRebuildWaitsForALedgerThatAnswers(t *testing.T) {
	t.Parallel()
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := tenHeld(t, rdb)
	ctx := context.Background()
	tx, err := f.l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE`, f.cfg.CampaignID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := f.e.RebuildWith(ctx, engine.RebuildOptions{Gate: func() string { return stock.StateOpen }, StallAfter: time.Second})
		done <- err
	}()
	testharness.WaitForLockWaiters(t, f.l.Pool().Config().ConnString(), 1, 30*time.Second, "the rebuild waiting for the campaign's row")
	select {
	case err := <-done:
		t.Fatalf("the rebuild returned while it waited for the lock: %v", err)
	case <-time.After(3 * time.Second):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the rebuild after the lock was let go: %v", err)
	}
	if c := f.assertConserved(); c.Reserved != 10 || c.Available != 40 {
		t.Fatalf("after the rebuild: %+v; want 10 reserved and 40 available", c)
	}
}

// tenHeld is a sale of 50 units on 2 shards, 10 of them held by ten buyers.
func tenHeld(t *testing.T, rdb redis.UniversalClient) *fixture {
	t.Helper()
	f := newFixture(t, rdb, withShards(2), withAllocation(50))
	for i := range 10 {
		f.reserve(fmt.Sprintf("buyer-%d", i), "r", 1)
	}
	return f
}
