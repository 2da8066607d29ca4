package ledger

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// Submissions under epoch E racing BeginRebuild: every row is either in the
// rebuild's snapshot (it committed before) or was fenced, never both, never
// neither.
func TestMaterializerRacingRebuild(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 1_000_000, 10)
	m := l.NewMaterializer(MaterializerConfig{Concurrency: 4, MaxBatch: 64})
	defer m.Close()

	type result struct {
		id  string
		err error
	}
	var (
		mu        sync.Mutex
		results   []result
		committed atomic.Int64
		stop      atomic.Bool
		wg        sync.WaitGroup
	)
	for g := range 64 {
		wg.Go(func() {
			// Keep submitting epoch-1 rows until well after the rebuild.
			for !stop.Load() {
				o := pendingOrder(c, uniqueID("user"), g%10, time.Hour)
				err := m.Submit(ctx, o)
				if err == nil {
					committed.Add(1)
				}
				mu.Lock()
				results = append(results, result{o.ReservationID, err})
				mu.Unlock()
			}
		})
	}
	for committed.Load() < 500 { // the rebuild lands mid-stream
		time.Sleep(time.Millisecond)
	}
	snap, err := l.BeginRebuild(ctx, c.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	orders, _, _ := readRebuild(t, l, snap.Campaign, 100)
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	if snap.PreviousEpoch != 1 || snap.Campaign.Epoch != 2 {
		t.Fatalf("epochs: previous %d, new %d", snap.PreviousEpoch, snap.Campaign.Epoch)
	}
	inSnapshot := make(map[string]bool, len(orders))
	for _, o := range orders {
		inSnapshot[o.ReservationID] = true
	}
	var written, fenced int
	for _, r := range results {
		switch {
		case r.err == nil:
			written++
			if !inSnapshot[r.id] {
				t.Errorf("%s committed but missing from the rebuild snapshot (oversell)", r.id)
			}
		case errors.Is(r.err, ErrFenced):
			fenced++
			if inSnapshot[r.id] {
				t.Errorf("%s fenced but counted by the rebuild", r.id)
			}
			if orderExists(t, l, r.id) {
				t.Errorf("%s fenced but written", r.id)
			}
		default:
			t.Errorf("%s: unexpected outcome %v", r.id, r.err)
		}
	}
	if written != len(orders) {
		t.Errorf("%d rows acknowledged, snapshot holds %d", written, len(orders))
	}
	if written == 0 || fenced == 0 {
		t.Fatalf("race not exercised: %d written, %d fenced", written, fenced)
	}
	t.Logf("%d written before the rebuild, %d fenced after it", written, fenced)
}

// PostgreSQL stopped: Submit fails cleanly (not nil, not a duplicate) and
// writes nothing; restarted: Submit works again on the same Ledger.
func TestMaterializerPostgresDown(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t) // its own server: stopping it must not disturb other tests
	l := openLedger(t, newDSN(t, pg))
	ctx := testCtx(t)
	c := newCampaign(t, l, 1000, 2)
	m := l.NewMaterializer(MaterializerConfig{Timeout: 2 * time.Second})
	defer m.Close()
	if err := m.Submit(ctx, pendingOrder(c, "u", 0, time.Hour)); err != nil {
		t.Fatal(err)
	}

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	down := make([]Order, 20)
	for i := range down {
		down[i] = pendingOrder(c, "u", i%2, time.Hour)
	}
	for i, err := range submitAll(ctx, m, down) {
		if err == nil || errors.Is(err, ErrDuplicate) || errors.Is(err, ErrFenced) {
			t.Fatalf("Submit with PostgreSQL down: %v", err)
		}
		if i == 0 {
			t.Logf("with PostgreSQL down: %v", err)
		}
	}

	// The connections from before the stop are gone by now: a row that gets
	// no connection was certainly not sent, so its caller may release its
	// unit at once instead of leaving it to expire.
	if err := m.Submit(ctx, pendingOrder(c, "u", 0, time.Hour)); err == nil || errors.Is(err, ErrAmbiguous) {
		t.Fatalf("Submit without a connection: %v, want a definite failure", err)
	}

	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	// Connections from before the restart are discarded as they fail; the
	// first submits may still meet one of them.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := m.Submit(ctx, pendingOrder(c, "u", 0, time.Hour))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Submit still failing after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	after := make([]Order, 50)
	for i := range after {
		after[i] = pendingOrder(c, "u", i%2, time.Hour)
	}
	for i, err := range submitAll(ctx, m, after) {
		if err != nil {
			t.Fatalf("Submit %d after restart: %v", i, err)
		}
	}
	// The ledger's pool, unused by the writers, still holds a connection from
	// before the restart, idle for less than pgx's ping threshold (1 s).
	l.Pool().Reset()
	for _, o := range down {
		if orderExists(t, l, o.ReservationID) {
			t.Errorf("%s failed while PostgreSQL was down but exists", o.ReservationID)
		}
	}
}

// The writers do not wait on the ledger's pool: with every connection of it
// held by reads (replays, lookups, checkouts on a slow PostgreSQL), rows are
// still written, on the writers' own connections, named as theirs.
func TestMaterializerWritesWhileReadsHoldThePool(t *testing.T) {
	t.Parallel()
	l := openLedger(t, newDSN(t, testPG)+"&pool_max_conns=1")
	ctx := testCtx(t)
	c := newCampaign(t, l, 10, 1)
	held, err := l.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	m := l.NewMaterializer(MaterializerConfig{Timeout: 2 * time.Second})
	defer m.Close()
	o := pendingOrder(c, "u", 0, time.Hour)
	if err := m.Submit(ctx, o); err != nil {
		t.Fatalf("Submit with the ledger's pool held by reads: %v", err)
	}
	var exists bool
	var writers int
	if err := held.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM flashsale_orders WHERE reservation_id = $1),
		(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'flashsale-ledger-writer')`,
		o.ReservationID).Scan(&exists, &writers); err != nil {
		t.Fatal(err)
	}
	if !exists || writers != 1 {
		t.Fatalf("row written %v, writer connections %d; want true, 1", exists, writers)
	}
}

// A row the insert skipped was not written; when the lookup that tells a
// duplicate from a fenced row fails (here its connection is terminated), the
// row is refused as such, not called fenced: a fence is a rebuild's, and
// nobody ran one. Not parallel: the hook is the package's.
func TestMaterializerLookupFailureIsNotAFence(t *testing.T) {
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 10, 1)
	m := l.NewMaterializer(MaterializerConfig{})
	defer m.Close()
	o := pendingOrder(c, "u", 0, time.Hour)
	if err := m.Submit(ctx, o); err != nil {
		t.Fatal(err)
	}
	testHookLookupDuplicates = func(pid uint32) {
		if _, err := l.Pool().Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Error(err)
		}
	}
	defer func() { testHookLookupDuplicates = nil }()
	err := m.Submit(ctx, o)
	if err == nil || errors.Is(err, ErrFenced) || errors.Is(err, ErrDuplicate) || !strings.Contains(err.Error(), "whether it was a duplicate is unknown") {
		t.Fatalf("Submit of a duplicate whose lookup failed: %v", err)
	}
}
