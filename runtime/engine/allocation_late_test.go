package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// A decrease whose COMMIT waits for a synchronous standby is committed for
// PostgreSQL but seen by no one, and the manager's call that sent it ends in
// an error: here the manager loses the network to PostgreSQL meanwhile, so
// that the cancel its driver sends on the way out (which would end the wait)
// is lost too, and another manager takes over. The units the decrease
// withdrew from the stock are its own once it lands: a call that would give
// them back (the spec put back to 100) must wait for it, or buyers take them
// on top of the lowered allocation. The reserve side commits locally (the
// server's default here); the first manager asks for the standby.
// Reservations wait meanwhile: their batches share-lock the campaign's row.
func TestUnitsOfADecreaseStillCommittingAreNotGivenBack(t *testing.T) {
	pg := testharness.PostgresT(t)
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixtureOn(t, rdb, pg, withAllocation(100), withShards(4))
	ctx := context.Background()
	ml, proxy := f.ledgerThroughProxy("&synchronous_commit=on")
	lost := openEngine(t, f.cfg, rdb, ml)

	holdCommits(t, pg, true)
	t.Cleanup(func() { holdCommits(t, pg, false) })
	cctx, cancel := context.WithCancel(ctx)
	first := make(chan error, 1)
	go func() {
		_, err := lost.ApplyAllocation(cctx, 80)
		first <- err
	}()
	waitForSyncRepWaiters(t, pg, 1)
	if _, err := proxy.Timeout(testharness.Upstream, 0); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-first; err == nil {
		t.Fatal("the decrease whose commit waits for a standby returned no error")
	}
	if n := syncRepWaiters(t, pg); n != 1 {
		t.Fatalf("%d commits wait for the standby after the manager gave up, want the decrease's", n)
	}

	// The next manager puts the allocation back to 100.
	type result struct {
		changed bool
		err     error
	}
	back := make(chan result, 1)
	go func() {
		changed, err := f.e.ApplyAllocation(ctx, 100)
		back <- result{changed, err}
	}()
	// Either it gave the units back at once, or it waits for the decrease.
	var early *result
	testharness.Eventually(t, 30*time.Second, "the call putting 100 back to answer or wait for the decrease", func() bool {
		select {
		case r := <-back:
			early = &r
			return true
		default:
		}
		return lockWaiters(t, f) > 0
	})
	holdCommits(t, pg, false) // the decrease lands
	if early == nil {
		r := <-back
		early = &r
	}
	// Buyers come before the manager's next try (they waited on the
	// campaign's row while the decrease held it).
	sold := sellOut(t, f, "before")
	t.Logf("the call putting 100 back: changed %v, %v; %d units sold once the decrease landed", early.changed, early.err, sold)
	testharness.Eventually(t, 30*time.Second, "the allocation back at 100", func() bool {
		_, err := f.e.ApplyAllocation(ctx, 100)
		return err == nil
	})
	sold += sellOut(t, f, "after")

	c, err := f.l.GetCampaign(ctx, f.cfg.CampaignID)
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	if err := f.l.Pool().QueryRow(ctx, `SELECT COALESCE(sum(quantity), 0) FROM flashsale_orders
WHERE campaign_id = $1 AND status IN ('PENDING', 'COMMITTED')`, f.cfg.CampaignID).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held > c.Allocation || int64(sold) != c.Allocation {
		t.Fatalf("I1: %d units reserved (%d in the ledger) on an allocation of %d", sold, held, c.Allocation)
	}
	f.assertConserved()
}

// sellOut reserves one unit for each of 150 new buyers and returns how many
// got one.
func sellOut(t *testing.T, f *fixture, wave string) int {
	t.Helper()
	sold := 0
	for i := range 150 {
		if r := f.reserve(fmt.Sprintf("%s-%d", wave, i), "r", 1); r.Outcome == engine.OutcomeReserved {
			sold++
		}
	}
	return sold
}

// holdCommits makes commits that ask for a synchronous standby wait for one
// that never comes, every other session committing locally; off releases
// the waiting ones, their commits landing then.
func holdCommits(t *testing.T, pg *testharness.Postgres, on bool) {
	t.Helper()
	stmts := []string{`ALTER SYSTEM RESET synchronous_standby_names`, `ALTER SYSTEM RESET synchronous_commit`}
	want := ""
	if on {
		stmts = []string{`ALTER SYSTEM SET synchronous_standby_names = never_connects`, `ALTER SYSTEM SET synchronous_commit = 'local'`}
		want = "never_connects"
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range append(stmts, `SELECT pg_reload_conf()`) {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	testharness.Eventually(t, 10*time.Second, "the reload to reach new sessions", func() bool {
		c, err := pgx.Connect(ctx, pg.AdminDSN())
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		var v string
		return c.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&v) == nil && v == want
	})
}

// syncRepWaiters counts the backends waiting for a standby at commit.
func syncRepWaiters(t *testing.T, pg *testharness.Postgres) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pg.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitForSyncRepWaiters waits until n backends wait for a standby at commit.
func waitForSyncRepWaiters(t *testing.T, pg *testharness.Postgres, n int) {
	t.Helper()
	testharness.Eventually(t, 30*time.Second, "a commit waiting for the standby", func() bool {
		return syncRepWaiters(t, pg) >= n
	})
}

// lockWaiters counts the backends of the fixture's database waiting on a lock.
func lockWaiters(t *testing.T, f *fixture) int {
	t.Helper()
	var n int
	if err := f.l.Pool().QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
