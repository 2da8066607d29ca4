package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// sqlInsertPending writes the rows of one campaign, sku and epoch in ONE
// statement (one round trip, its own transaction). The CTE share-locks the
// campaign row, so a rebuild's FOR UPDATE waits for this statement to commit,
// or this statement waits for the rebuild and then sees the new epoch: either
// every row is written or, when the epoch is not the campaign's (or the
// campaign is deleted or missing), none is.
//
// It has no ON CONFLICT clause: a row that already exists fails the whole
// statement (unique_violation, nothing written) and the rows are sent again as
// sqlInsertPendingSkipDuplicates. Duplicates are rare (a request whose earlier
// row outlived its Redis hash), and the clause would make PostgreSQL probe the
// primary key before every insert on top of the probe the insert itself does.
const sqlInsertPending = `WITH live AS (
    SELECT epoch FROM flashsale_campaigns
    WHERE campaign_id = $1 AND deleted_at IS NULL
    FOR SHARE)
INSERT INTO flashsale_orders
    (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at, request_key)
SELECT t.r, $1, $2, t.u, t.sh, t.q, 'PENDING', $3, t.x, nullif(split_part(t.r, '.', 2), '')
FROM unnest($4::text[], $5::text[], $6::integer[], $7::integer[], $8::timestamptz[]) AS t(r, u, sh, q, x)
WHERE (SELECT epoch FROM live) = $3`

// sqlInsertPendingSkipDuplicates is sqlInsertPending that skips the rows
// already present (by reservation id, or by request key: the same request on
// another shard, see 0003_request_key.sql) and returns the ids it wrote.
const sqlInsertPendingSkipDuplicates = sqlInsertPending + `
ON CONFLICT DO NOTHING
RETURNING reservation_id`

// uniqueViolation is PostgreSQL's SQLSTATE for a duplicate key.
const uniqueViolation = "23505"

// sqlExistingOrders tells, for rows the insert skipped, which already existed
// as the same reservation or the same request (duplicates); the others were
// fenced.
const sqlExistingOrders = `SELECT t.id FROM unnest($1::text[]) AS t(id)
WHERE EXISTS (SELECT 1 FROM flashsale_orders o WHERE o.reservation_id = t.id)
   OR EXISTS (SELECT 1 FROM flashsale_orders o WHERE o.campaign_id = $2 AND o.request_key = split_part(t.id, '.', 2))`

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

// NewMaterializer starts the workers; Close stops them.
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
//   - ErrAmbiguous: COMMIT failed, the row may or may not exist;
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

// write runs one batch transaction and tells every caller its row's outcome.
func (m *Materializer) write(batch []*pendingRow) {
	// Rows whose caller gave up before the batch was sent are dropped: not written.
	send := make([]*pendingRow, 0, len(batch))
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.res <- fmt.Errorf("ledger: materialize %s: %w: %w", r.o.ReservationID, ErrNotSent, err)
			continue
		}
		send = append(send, r)
	}
	// Sorted so that concurrent batches take the unique keys' locks in one
	// order and cannot deadlock on each other's duplicates.
	slices.SortStableFunc(send, func(a, b *pendingRow) int { return byRequest(a.o.ReservationID, b.o.ReservationID) })
	// The same id twice in one INSERT would be returned once and claimed by
	// both callers; later copies share the first copy's fate instead.
	var twins map[*pendingRow]*pendingRow
	uniq := send[:0:0]
	for i, r := range send {
		if i > 0 && r.o.ReservationID == send[i-1].o.ReservationID {
			if twins == nil {
				twins = map[*pendingRow]*pendingRow{}
			}
			first := send[i-1]
			if f, ok := twins[first]; ok {
				first = f
			}
			twins[r] = first
			continue
		}
		uniq = append(uniq, r)
	}
	if len(uniq) == 0 {
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Timeout)
	start := time.Now()
	results := m.insertBatch(ctx, uniq)
	d := time.Since(start)
	cancel()

	for i, r := range uniq {
		r.res <- results[i]
	}
	for twin, first := range twins {
		err := results[slices.Index(uniq, first)]
		if err == nil {
			err = fmt.Errorf("%w: %s (twice in one batch)", ErrDuplicate, twin.o.ReservationID)
		}
		twin.res <- err
	}
	if m.cfg.OnBatch != nil {
		m.cfg.OnBatch(len(uniq), d)
	}
}

// insertBatch returns one outcome per row (rows have distinct ids). Rows are
// written per campaign, sku and epoch: a process serving one campaign sends one
// statement per batch.
func (m *Materializer) insertBatch(ctx context.Context, rows []*pendingRow) []error {
	results := make([]error, len(rows))
	type group struct {
		campaign, sku string
		epoch         int64
	}
	var idx []int
	done := make([]bool, len(rows))
	for i := range rows {
		if done[i] {
			continue
		}
		g := group{rows[i].o.CampaignID, rows[i].o.SKU, rows[i].o.Epoch}
		idx = idx[:0]
		for j := i; j < len(rows); j++ {
			if o := rows[j].o; !done[j] && (group{o.CampaignID, o.SKU, o.Epoch}) == g {
				idx = append(idx, j)
				done[j] = true
			}
		}
		m.insertGroup(ctx, rows, idx, results)
	}
	return results
}

// insertGroup writes rows[idx] (one campaign, sku and epoch) and sets their
// results.
func (m *Materializer) insertGroup(ctx context.Context, rows []*pendingRow, idx []int, results []error) {
	n := len(idx)
	first := rows[idx[0]].o
	ids, users := make([]string, n), make([]string, n)
	shards, qtys := make([]int32, n), make([]int32, n)
	expires := make([]time.Time, n)
	for k, i := range idx {
		o := rows[i].o
		ids[k], users[k], shards[k], qtys[k], expires[k] = o.ReservationID, o.UserID, int32(o.Shard), int32(o.Quantity), o.ExpiresAt
	}
	args := []any{first.CampaignID, first.SKU, first.Epoch, ids, users, shards, qtys, expires}
	set := func(err error) {
		for _, i := range idx {
			results[i] = err
		}
	}
	fenced := func(i int) error {
		o := rows[i].o
		return fmt.Errorf("%w: %s: campaign %s is not at epoch %d (rebuilt, deleted or missing)", ErrFenced, o.ReservationID, o.CampaignID, o.Epoch)
	}

	// The connection is taken first: failing to get one (PostgreSQL down, or
	// the pool busy past the batch's deadline) means nothing was sent, so the
	// callers release their units at once instead of holding them until
	// they expire.
	conn, err := m.l.pool.Acquire(ctx)
	if err != nil {
		for _, i := range idx {
			results[i] = fmt.Errorf("ledger: materialize %s: not sent, no connection: %w", rows[i].o.ReservationID, err)
		}
		return
	}
	defer conn.Release()
	tag, err := conn.Exec(ctx, sqlInsertPending, args...)
	if err == nil {
		switch written := tag.RowsAffected(); {
		case written == int64(n):
			set(nil)
		case written == 0:
			for _, i := range idx {
				results[i] = fenced(i)
			}
		default: // all or nothing by construction
			set(fmt.Errorf("%w: %d of %d rows of campaign %s written", ErrAmbiguous, written, n, first.CampaignID))
		}
		return
	}
	returned := map[string]bool{}
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == uniqueViolation {
		// Refused as a whole, nothing written: again, skipping the rows present.
		var inserted pgx.Rows
		inserted, err = conn.Query(ctx, sqlInsertPendingSkipDuplicates, args...)
		if err == nil {
			var id string
			_, err = pgx.ForEachRow(inserted, []any{&id}, func() error {
				returned[id] = true
				return nil
			})
		}
	}
	if err != nil {
		// A statement the server refused, or one never sent, changed nothing;
		// any other failure may have hit the implicit commit.
		var pgErr *pgconn.PgError
		definite := errors.As(err, &pgErr) || pgconn.SafeToRetry(err)
		for _, i := range idx {
			if definite {
				results[i] = fmt.Errorf("ledger: materialize %s: %w", rows[i].o.ReservationID, err)
			} else {
				results[i] = fmt.Errorf("%w: %s: %w", ErrAmbiguous, rows[i].o.ReservationID, err)
			}
		}
		return
	}
	var skipped []string
	for _, id := range ids {
		if !returned[id] {
			skipped = append(skipped, id)
		}
	}
	// Skipped rows were certainly not written by this statement; tell
	// duplicates from fenced rows.
	existing := map[string]bool{}
	if len(skipped) > 0 {
		if ex, err := conn.Query(ctx, sqlExistingOrders, skipped, first.CampaignID); err == nil {
			var id string
			_, _ = pgx.ForEachRow(ex, []any{&id}, func() error {
				existing[id] = true
				return nil
			})
		}
	}
	for _, i := range idx {
		id := rows[i].o.ReservationID
		switch {
		case returned[id]:
			results[i] = nil
		case existing[id]:
			results[i] = fmt.Errorf("%w: %s", ErrDuplicate, id)
		default:
			results[i] = fenced(i)
		}
	}
}
