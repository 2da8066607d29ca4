package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A rebuild whose ledger stops answering without closing its connections
// (every byte from PostgreSQL swallowed from the moment the rebuild's start
// is recorded) gives up once it made no progress for StallAfter, with
// ErrRebuildStalled, instead of holding the closed shards forever; the
// shards stay closed, and the next rebuild on a ledger that answers opens
// them with every unit accounted for.
func TestRebuildGivesUpWhenTheLedgerStalls(t *testing.T) {
	t.Parallel()
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withShards(2), withAllocation(50))
	for i := range 10 {
		f.reserve(fmt.Sprintf("buyer-%d", i), "r", 1)
	}
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
	go func() {
		_, err := e.RebuildWith(context.Background(), engine.RebuildOptions{
			Gate:       func() string { return stock.StateOpen },
			StallAfter: time.Second,
			Begun: func(int64) {
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
		<-done
		t.Fatal("the rebuild still waited for the ledger 30 s after it stopped answering (StallAfter 1s)")
	}
	t.Logf("the rebuild: %v", err)
	if !errors.Is(err, engine.ErrRebuildStalled) || !strings.Contains(err.Error(), "nothing read from the ledger or written to Redis for") {
		t.Fatalf("the rebuild on a stalled ledger: %v; want ErrRebuildStalled", err)
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
