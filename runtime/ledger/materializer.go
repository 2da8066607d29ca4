package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// MaterializerConfig tunes the group-commit writer. Zero values take defaults.
type MaterializerConfig struct {
	MaxBatch int // rows per transaction; default 256
	// MaxWait is how long a worker lingers for more rows after taking the first;
	// default 0: a free worker sends what is queued at once. Batches still grow
	// with load, because rows queue up while a batch is in flight.
	MaxWait time.Duration
	// Concurrency is the most batches in flight at once; default 2. One is the
	// rule: a further batch starts only when MaxBatch rows are waiting.
	Concurrency int
	// Timeout bounds one batch transaction, so a hung PostgreSQL turns into
	// errors instead of stuck callers; default 5s.
	Timeout time.Duration
	// OnBatch, if set, is called after every batch transaction with the rows
	// sent and its duration. It is called from several goroutines at once.
	OnBatch func(size int, d time.Duration)
}

const (
	defaultMaxBatch       = 256
	defaultConcurrency    = 2
	defaultMaterializeTTL = 5 * time.Second
)

// Materializer writes PENDING order rows in batches: many concurrent Submits
// share one transaction, so PostgreSQL sees a few commits per millisecond
// instead of one per reservation.
//
// One batch is in flight while the load allows: rows queue up during its
// transaction and go together in the next, so batches grow with the load and
// PostgreSQL pays its per-statement cost once per batch. A further batch starts
// alongside only when a full batch (MaxBatch rows) is waiting, that is when one
// transaction at a time can no longer keep up.
type Materializer struct {
	l   *Ledger
	cfg MaterializerConfig
	// pool is the writers' own, one connection per worker: the ledger's pool
	// serves every read of the process (replays, lookups, checkout, cancel),
	// and a burst of them on a slow PostgreSQL would otherwise keep the
	// writers waiting for a connection until every reserve is refused.
	pool *pgxpool.Pool

	mu      sync.Mutex
	pending []*pendingRow
	busy    int // batches taken and not yet written
	closed  bool

	wake chan struct{} // poked when rows arrive; capacity 1
	done chan struct{} // closed by Close
	wg   sync.WaitGroup
	once sync.Once

	// sending holds, per worker, when its batch went to PostgreSQL (nanoseconds
	// since start, on the monotonic clock, plus one; 0 while it has none): see
	// Stalled.
	sending []atomic.Int64
	start   time.Time
}

type pendingRow struct {
	ctx context.Context
	o   Order
	res chan error // buffered: the writer never blocks on a caller
}

// NewMaterializer starts the workers; Close stops them. The workers have a
// connection each, outside the ledger's pool and opened when first needed
// (application_name flashsale-ledger-writer unless the DSN names one).
func (l *Ledger) NewMaterializer(cfg MaterializerConfig) *Materializer {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = defaultMaxBatch
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = defaultConcurrency
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultMaterializeTTL
	}
	m := &Materializer{
		l:       l,
		cfg:     cfg,
		pool:    l.writerPool(cfg.Concurrency),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		sending: make([]atomic.Int64, cfg.Concurrency),
		start:   time.Now(),
	}
	m.wg.Add(cfg.Concurrency)
	for i := range cfg.Concurrency {
		go m.work(&m.sending[i])
	}
	return m
}

// Stalled reports whether a batch has been waiting for PostgreSQL longer than
// d: the ledger hangs or cannot keep up, and a row submitted now would wait
// as long.
func (m *Materializer) Stalled(d time.Duration) bool {
	limit := int64(time.Since(m.start)-d) + 1
	for i := range m.sending {
		if t := m.sending[i].Load(); t != 0 && t < limit {
			return true
		}
	}
	return false
}

// Submit writes o as a PENDING row and blocks until its outcome is known:
//
//   - nil: the row is durable (its transaction committed);
//   - ErrFenced: the campaign's epoch is not o.Epoch, or the campaign is
//     missing or deleted; not written;
//   - ErrDuplicate: a row with this reservation id already existed; not
//     written by this call;
//   - ErrAmbiguous: the batch failed where it may have committed (a lost
//     connection, a timeout, a PANIC, a FATAL but those only a session's
//     start sends): the row may or may not exist;
//   - anything else: definitely not written.
//
// A ctx that ends while the row is queued returns at once: not written. Once
// the row's batch is taken Submit waits for it (at most cfg.Timeout) even if
// ctx ends, because only then is the outcome known. o.Status must be empty or
// PENDING.
func (m *Materializer) Submit(ctx context.Context, o Order) error {
	if err := validatePending(o); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ledger: materialize %s: %w: %w", o.ReservationID, ErrNotSent, err)
	}
	r := &pendingRow{ctx: ctx, o: o, res: make(chan error, 1)}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	m.pending = append(m.pending, r)
	// Only an idle writer set (nothing in flight) or a full batch lets a worker
	// start; otherwise the busy worker takes the row when it is done, and waking
	// an idle one would only put it back to sleep.
	wake := m.busy == 0 || len(m.pending) >= m.cfg.MaxBatch
	m.mu.Unlock()
	if wake {
		m.poke()
	}
	select {
	case err := <-r.res:
		return err
	case <-ctx.Done():
	}
	// The caller gave up. A row still queued is withdrawn: not written. One
	// already in a batch has its outcome soon (the batch's own timeout).
	m.mu.Lock()
	if i := slices.Index(m.pending, r); i >= 0 {
		m.pending = slices.Delete(m.pending, i, i+1)
		m.mu.Unlock()
		return fmt.Errorf("ledger: materialize %s: %w: %w", o.ReservationID, ErrNotSent, ctx.Err())
	}
	m.mu.Unlock()
	return <-r.res
}

func (m *Materializer) poke() {
	select {
	case m.wake <- struct{}{}:
	default: // a wake-up is already due
	}
}

func validatePending(o Order) error {
	switch {
	case o.ReservationID == "":
		return errors.New("ledger: materialize: empty reservation id")
	case o.CampaignID == "":
		return fmt.Errorf("ledger: materialize %s: empty campaign id", o.ReservationID)
	case o.Quantity <= 0:
		return fmt.Errorf("ledger: materialize %s: quantity %d <= 0", o.ReservationID, o.Quantity)
	case o.Shard < 0:
		return fmt.Errorf("ledger: materialize %s: shard %d < 0", o.ReservationID, o.Shard)
	case o.ExpiresAt.IsZero():
		return fmt.Errorf("ledger: materialize %s: no expiry", o.ReservationID)
	case o.Status != "" && o.Status != StatusPending:
		return fmt.Errorf("ledger: materialize %s: status %s, only PENDING rows are materialized", o.ReservationID, o.Status)
	}
	return nil
}

// Close writes what is already queued, then stops the writers. Submit after
// Close returns ErrClosed. Close is idempotent.
func (m *Materializer) Close() {
	m.once.Do(func() {
		m.mu.Lock()
		m.closed = true
		m.mu.Unlock()
		close(m.done)
	})
	m.wg.Wait()
	if m.pool != m.l.pool {
		m.pool.Close()
	}
}

// writerPool is a pool of n connections configured as the ledger's own.
func (l *Ledger) writerPool(n int) *pgxpool.Pool {
	if l.cfg == nil { // a Ledger made around a pool (tests)
		return l.pool
	}
	cfg := l.cfg.Copy()
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = int32(n), 0, 0
	writerSessions(cfg)
	if cfg.ConnConfig.RuntimeParams["application_name"] == defaultApplicationName {
		cfg.ConnConfig.RuntimeParams["application_name"] = defaultApplicationName + "-writer"
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil { // only for a MaxConns below 1, which n never is
		return l.pool
	}
	return p
}

// work writes batches until Close has been called and nothing is queued;
// sending says since when its batch is out.
func (m *Materializer) work(sending *atomic.Int64) {
	defer m.wg.Done()
	for {
		batch := m.take()
		if batch == nil {
			return
		}
		sending.Store(int64(time.Since(m.start)) + 1)
		m.write(batch)
		sending.Store(0)
		m.mu.Lock()
		m.busy--
		m.mu.Unlock()
	}
}

// take blocks until this worker may send a batch and returns it (nil once
// closed and drained). A worker may send when no batch is in flight, or when a
// full batch is waiting, or while closing. With MaxWait set it then lingers up to
// MaxWait for the batch to fill.
func (m *Materializer) take() []*pendingRow {
	var linger <-chan time.Time
	lingering := false
	m.mu.Lock()
	for {
		n := len(m.pending)
		full := n >= m.cfg.MaxBatch
		switch {
		case lingering && (full || linger == nil || m.closed):
			return m.cut()
		case !lingering && n > 0 && (m.busy == 0 || full || m.closed):
			m.busy++
			if full || m.closed || m.cfg.MaxWait <= 0 {
				return m.cut()
			}
			lingering = true
			timer := time.NewTimer(m.cfg.MaxWait)
			defer timer.Stop()
			linger = timer.C
			continue
		case !lingering && n == 0 && m.closed:
			m.mu.Unlock()
			return nil
		}
		done := m.done
		if m.closed {
			done = nil // already seen
		}
		m.mu.Unlock()
		select {
		case <-m.wake:
		case <-done:
		case <-linger:
			linger = nil
		}
		m.mu.Lock()
	}
}

// cut takes up to MaxBatch queued rows, unlocks m.mu and passes the wake-up on
// when a full batch remains.
func (m *Materializer) cut() []*pendingRow {
	k := min(len(m.pending), m.cfg.MaxBatch)
	batch := make([]*pendingRow, k)
	copy(batch, m.pending)
	rest := copy(m.pending, m.pending[k:])
	clear(m.pending[rest:])
	m.pending = m.pending[:rest]
	m.mu.Unlock()
	if rest >= m.cfg.MaxBatch {
		m.poke() // another full batch: another worker may take it
	}
	return batch
}
