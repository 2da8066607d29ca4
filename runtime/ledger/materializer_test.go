package ledger

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// batchStats records what OnBatch saw.
type batchStats struct {
	mu    sync.Mutex
	sizes []int
}

func (s *batchStats) hook(size int, _ time.Duration) {
	s.mu.Lock()
	s.sizes = append(s.sizes, size)
	s.mu.Unlock()
}

func (s *batchStats) summary() (batches, rows, largest int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.sizes {
		rows += n
		largest = max(largest, n)
	}
	return len(s.sizes), rows, largest
}

// submitAll submits every order from its own goroutine, released together,
// and returns the outcomes in order.
func submitAll(ctx context.Context, m *Materializer, orders []Order) []error {
	errs := make([]error, len(orders))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, o := range orders {
		wg.Go(func() {
			<-start
			errs[i] = m.Submit(ctx, o)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

func TestMaterializerConcurrentSubmits(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 10_000, 10)
	var stats batchStats
	m := l.NewMaterializer(MaterializerConfig{OnBatch: stats.hook})
	defer m.Close()

	const n = 2000
	orders := make([]Order, n)
	for i := range orders {
		orders[i] = pendingOrder(c, uniqueID("user"), i%10, time.Hour)
	}
	for i, err := range submitAll(ctx, m, orders) {
		if err != nil {
			t.Fatalf("Submit %s: %v", orders[i].ReservationID, err)
		}
	}
	var rows int
	if err := l.Pool().QueryRow(ctx, sqlTestCountOrders, c.ID).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != n {
		t.Fatalf("%d rows durable, want %d", rows, n)
	}
	m.Close() // callers hear their outcome before OnBatch runs: wait for the writers
	batches, sent, largest := stats.summary()
	if sent != n {
		t.Errorf("OnBatch saw %d rows, want %d", sent, n)
	}
	if largest <= 1 || batches >= n {
		t.Errorf("no group commit: %d batches, largest %d", batches, largest)
	}
	t.Logf("%d rows in %d batches, largest %d", n, batches, largest)

	got, err := l.GetOrder(ctx, orders[7].CampaignID, orders[7].ReservationID)
	if err != nil {
		t.Fatal(err)
	}
	want := orders[7]
	if got.Status != StatusPending || got.UserID != want.UserID || got.Shard != want.Shard || got.Quantity != 1 ||
		got.Epoch != c.Epoch || got.SKU != c.SKU || !got.ExpiresAt.Equal(want.ExpiresAt.Truncate(time.Microsecond)) || got.PaymentToken != "" {
		t.Errorf("stored %+v, submitted %+v", got, want)
	}
}

// One wave mixing new rows, rows that already exist, stale epochs and an
// unknown campaign: every caller must get its own row's outcome, even when
// they share a batch.
func TestMaterializerOutcomesPerRow(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 1000, 4)
	other := newCampaign(t, l, 1000, 4)
	var stats batchStats
	m := l.NewMaterializer(MaterializerConfig{MaxWait: 20 * time.Millisecond, OnBatch: stats.hook})
	defer m.Close()

	existing := make([]Order, 50)
	for i := range existing {
		existing[i] = pendingOrder(c, "u", i%4, time.Hour)
	}
	for i, err := range submitAll(ctx, m, existing) {
		if err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
	}

	type kind int
	const (
		fresh kind = iota
		dup
		stale
		unknown
	)
	var orders []Order
	var kinds []kind
	for i := range 400 {
		var o Order
		var k kind
		switch i % 4 {
		case 0, 1:
			o, k = pendingOrder(c, "u", i%4, time.Hour), fresh
			if i%8 == 1 {
				o = pendingOrder(other, "u", i%4, time.Hour)
			}
		case 2:
			o, k = existing[i/8], dup
		case 3:
			if i%8 == 3 {
				o, k = pendingOrder(c, "u", 0, time.Hour), stale
				o.Epoch = c.Epoch + 1
			} else {
				o, k = pendingOrder(c, "u", 0, time.Hour), unknown
				o.CampaignID = "no-such-campaign"
			}
		}
		orders, kinds = append(orders, o), append(kinds, k)
	}
	for i, err := range submitAll(ctx, m, orders) {
		id := orders[i].ReservationID
		switch kinds[i] {
		case fresh:
			if err != nil {
				t.Errorf("fresh %s: %v", id, err)
			}
		case dup:
			if !errors.Is(err, ErrDuplicate) {
				t.Errorf("existing %s: %v, want ErrDuplicate", id, err)
			}
		case stale, unknown:
			if !errors.Is(err, ErrFenced) {
				t.Errorf("fenced %s: %v, want ErrFenced", id, err)
			}
			if orderExists(t, l, id) {
				t.Errorf("fenced %s was written", id)
			}
		}
	}
	m.Close() // callers hear their outcome before OnBatch runs: wait for the writers
	if _, _, largest := stats.summary(); largest <= 1 {
		t.Errorf("largest batch %d: outcomes were never mixed in one batch", largest)
	}
}

func TestMaterializerSameIDTwiceAtOnce(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	c := newCampaign(t, l, 100, 1)
	m := l.NewMaterializer(MaterializerConfig{MaxWait: 20 * time.Millisecond})
	defer m.Close()
	for range 20 {
		o := pendingOrder(c, "u", 0, time.Hour)
		var ok, dup int
		for _, err := range submitAll(testCtx(t), m, []Order{o, o, o}) {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, ErrDuplicate):
				dup++
			default:
				t.Fatal(err)
			}
		}
		if ok != 1 || dup != 2 {
			t.Fatalf("same id three times: %d written, %d duplicates", ok, dup)
		}
	}
}

func TestMaterializerFencedByEpoch(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	m := l.NewMaterializer(MaterializerConfig{})
	defer m.Close()

	if _, err := l.BeginRebuild(ctx, c.ID, 0); err != nil { // epoch 1 → 2
		t.Fatal(err)
	}
	stale := pendingOrder(c, "u", 0, time.Hour) // epoch 1
	if err := m.Submit(ctx, stale); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale epoch: %v, want ErrFenced", err)
	}
	if orderExists(t, l, stale.ReservationID) {
		t.Fatal("fenced row was written")
	}
	current := pendingOrder(c, "u", 0, time.Hour)
	current.Epoch = 2
	if err := m.Submit(ctx, current); err != nil {
		t.Fatalf("current epoch: %v", err)
	}
}

func TestMaterializerValidatesAndCancels(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	c := newCampaign(t, l, 100, 2)
	m := l.NewMaterializer(MaterializerConfig{})
	defer m.Close()

	bad := pendingOrder(c, "u", 0, time.Hour)
	bad.Status = StatusCommitted
	if err := m.Submit(testCtx(t), bad); err == nil {
		t.Error("COMMITTED row accepted")
	}
	bad = pendingOrder(c, "u", 0, time.Hour)
	bad.Quantity = 0
	if err := m.Submit(testCtx(t), bad); err == nil {
		t.Error("quantity 0 accepted")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o := pendingOrder(c, "u", 0, time.Hour)
	if err := m.Submit(ctx, o); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: %v", err)
	}
	if orderExists(t, l, o.ReservationID) {
		t.Error("row of a cancelled Submit was written")
	}
}

func TestMaterializerCloseFlushes(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	c := newCampaign(t, l, 1000, 2)
	// A long MaxWait: the queued rows are only sent because Close flushes them.
	m := l.NewMaterializer(MaterializerConfig{MaxWait: time.Minute, MaxBatch: 1000})
	orders := make([]Order, 100)
	for i := range orders {
		orders[i] = pendingOrder(c, "u", 0, time.Hour)
	}
	var errs []error
	done := make(chan struct{})
	go func() {
		errs = submitAll(testCtx(t), m, orders)
		close(done)
	}()
	// Every submit queued before Close: none was refused for arriving late.
	testharness.Eventually(t, 30*time.Second, "the 100 submits to queue", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.pending) == len(orders)
	})
	m.Close()
	<-done
	for i, err := range errs {
		if err != nil {
			t.Errorf("Submit %d, queued before Close: %v, want it flushed", i, err)
		}
		if !orderExists(t, l, orders[i].ReservationID) {
			t.Errorf("Submit %d returned %v but its row is not written", i, err)
		}
	}
	if err := m.Submit(testCtx(t), pendingOrder(c, "u", 0, time.Hour)); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit after Close: %v", err)
	}
	m.Close() // idempotent
}

// One batch is in flight while one keeps up: rows that arrive during its
// transaction wait for it, until a full batch (MaxBatch rows) waits, which
// starts alongside. The campaign row is held FOR UPDATE (as a rebuild would) so
// that the batches block where they can be counted.
func TestMaterializerSecondBatchOnlyWhenAFullOneWaits(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 1000, 1)
	var stats batchStats
	m := l.NewMaterializer(MaterializerConfig{MaxBatch: 8, Concurrency: 3, OnBatch: stats.hook})
	defer m.Close()

	lock := holdLock(t, l, sqlTestLockCampaign, c.ID)
	inFlight := func() int { // batch statements of this database waiting for the lock
		var n int
		if err := l.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'WITH live AS%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	queued := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.pending)
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	results := make(chan error, 12)
	submit := func(n int) {
		for range n {
			go func() { results <- m.Submit(ctx, pendingOrder(c, uniqueID("u"), 0, time.Hour)) }()
		}
	}

	submit(1)
	eventually("the first batch to block", func() bool { return inFlight() == 1 })
	submit(7)
	eventually("7 rows to queue", func() bool { return queued() == 7 })
	time.Sleep(100 * time.Millisecond)
	if n := inFlight(); n != 1 {
		t.Fatalf("%d batches in flight with 7 of 8 rows queued, want 1", n)
	}
	submit(1)
	eventually("a second batch once 8 rows wait", func() bool { return inFlight() == 2 && queued() == 0 })
	submit(3)
	eventually("3 rows to queue", func() bool { return queued() == 3 })
	time.Sleep(100 * time.Millisecond)
	if n := inFlight(); n != 2 {
		t.Fatalf("%d batches in flight with 3 rows queued, want 2", n)
	}

	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range 12 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	// A batch's callers hear their outcome before OnBatch runs: Close waits for
	// the writers, OnBatch included.
	m.Close()
	stats.mu.Lock()
	sizes := slices.Clone(stats.sizes)
	stats.mu.Unlock()
	slices.Sort(sizes)
	if !slices.Equal(sizes, []int{1, 3, 8}) {
		t.Errorf("batch sizes %v, want 1, 8 and 3", sizes)
	}
}

// A caller whose deadline passes while its row waits behind a stuck batch
// returns at once, told the row was not written, and the row never is.
func TestMaterializerQueuedRowLeavesWithItsCaller(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 1000, 1)
	m := l.NewMaterializer(MaterializerConfig{Concurrency: 1, Timeout: time.Minute})
	defer m.Close()
	lock := holdLock(t, l, sqlTestLockCampaign, c.ID)
	stuck := make(chan error, 1)
	go func() { stuck <- m.Submit(ctx, pendingOrder(c, "u", 0, time.Hour)) }()
	testharness.Eventually(t, 10*time.Second, "the first batch in flight", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.busy == 1 && len(m.pending) == 0
	})
	queued := pendingOrder(c, "u", 0, time.Hour)
	qctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := m.Submit(qctx, queued)
	if d := time.Since(start); d > 5*time.Second || err == nil || errors.Is(err, ErrAmbiguous) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after %s: %v, want a definite failure at the deadline", d, err)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-stuck; err != nil {
		t.Fatalf("the stuck batch: %v", err)
	}
	if orderExists(t, l, queued.ReservationID) {
		t.Fatalf("%s was withdrawn but exists", queued.ReservationID)
	}
}
