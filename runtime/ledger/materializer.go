package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// MaterializerConfig tunes the group-commit writer. Zero values take defaults.
type MaterializerConfig struct {
	MaxBatch int // rows per transaction; default 256
	// MaxWait is how long a worker lingers for more rows after taking the first;
	// default 0: a free worker sends what is queued at once. Batches still grow
	// with load, because rows queue up while every worker is busy.
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

// sqlInsertPending writes a batch in ONE statement (one round trip, its own
// transaction): the CTE share-locks the campaign rows, so a rebuild's FOR UPDATE
// waits for this statement to commit, or this statement waits for the rebuild and
// then sees the new epoch. Only rows whose epoch matches their live campaign are
// inserted and returned.
//
// It has no ON CONFLICT clause: a row that already exists fails the whole
// statement (unique_violation, nothing written) and the batch is sent again as
// sqlInsertPendingSkipDuplicates. Duplicates are rare (a request whose earlier
// row outlived its Redis hash), and the clause would make PostgreSQL probe the
// primary key before every insert on top of the probe the insert itself does.
const sqlInsertPending = sqlInsertPendingHead + `
RETURNING reservation_id`

// sqlInsertPendingSkipDuplicates is sqlInsertPending that skips rows already
// present instead of failing.
const sqlInsertPendingSkipDuplicates = sqlInsertPendingHead + `
ON CONFLICT (reservation_id) DO NOTHING
RETURNING reservation_id`

// uniqueViolation is PostgreSQL's SQLSTATE for a duplicate key.
const uniqueViolation = "23505"

const sqlInsertPendingHead = `WITH live AS (
    SELECT campaign_id, epoch FROM flashsale_campaigns
    WHERE campaign_id = ANY($9::text[]) AND deleted_at IS NULL
    ORDER BY campaign_id
    FOR SHARE)
INSERT INTO flashsale_orders
    (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at)
SELECT t.r, t.c, t.s, t.u, t.sh, t.q, 'PENDING', t.e, t.x
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::integer[], $6::integer[], $7::bigint[], $8::timestamptz[])
    AS t(r, c, s, u, sh, q, e, x)
JOIN live ON live.campaign_id = t.c AND live.epoch = t.e`

// sqlExistingOrders tells, for rows the insert skipped, which already existed
// (duplicates); the others were fenced.
const sqlExistingOrders = `SELECT reservation_id FROM flashsale_orders WHERE reservation_id = ANY($1::text[])`

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
		l:    l,
		cfg:  cfg,
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	m.wg.Add(cfg.Concurrency)
	for range cfg.Concurrency {
		go m.work()
	}
	return m
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
// A ctx that ends before the row's batch is sent means not written. Once the
// batch is sent Submit waits for it (at most cfg.Timeout) even if ctx ends,
// because only then is the outcome known. o.Status must be empty or PENDING.
func (m *Materializer) Submit(ctx context.Context, o Order) error {
	if err := validatePending(o); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ledger: materialize %s: not sent: %w", o.ReservationID, err)
	}
	r := &pendingRow{ctx: ctx, o: o, res: make(chan error, 1)}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	m.pending = append(m.pending, r)
	m.mu.Unlock()
	m.poke()
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

// work writes batches until Close has been called and nothing is queued.
func (m *Materializer) work() {
	defer m.wg.Done()
	for {
		batch := m.take()
		if batch == nil {
			return
		}
		m.write(batch)
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
// when rows remain, so that another worker can judge them.
func (m *Materializer) cut() []*pendingRow {
	k := min(len(m.pending), m.cfg.MaxBatch)
	batch := make([]*pendingRow, k)
	copy(batch, m.pending)
	rest := copy(m.pending, m.pending[k:])
	clear(m.pending[rest:])
	m.pending = m.pending[:rest]
	m.mu.Unlock()
	if rest > 0 {
		m.poke()
	}
	return batch
}

// write runs one batch transaction and tells every caller its row's outcome.
func (m *Materializer) write(batch []*pendingRow) {
	// Rows whose caller gave up before the batch was sent are dropped: not written.
	send := make([]*pendingRow, 0, len(batch))
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.res <- fmt.Errorf("ledger: materialize %s: not sent: %w", r.o.ReservationID, err)
			continue
		}
		send = append(send, r)
	}
	// Sorted so that concurrent batches take primary-key locks in one order
	// and cannot deadlock on each other's duplicates.
	slices.SortStableFunc(send, func(a, b *pendingRow) int { return strings.Compare(a.o.ReservationID, b.o.ReservationID) })
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

// insertBatch returns one outcome per row (rows have distinct ids).
func (m *Materializer) insertBatch(ctx context.Context, rows []*pendingRow) []error {
	n := len(rows)
	ids, camps, skus, users := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	shards, qtys := make([]int32, 0, n), make([]int32, 0, n)
	epochs, expires := make([]int64, 0, n), make([]time.Time, 0, n)
	var campaigns []string
	for _, r := range rows {
		o := r.o
		ids, camps, skus, users = append(ids, o.ReservationID), append(camps, o.CampaignID), append(skus, o.SKU), append(users, o.UserID)
		shards, qtys = append(shards, int32(o.Shard)), append(qtys, int32(o.Quantity))
		epochs, expires = append(epochs, o.Epoch), append(expires, o.ExpiresAt)
		if !slices.Contains(campaigns, o.CampaignID) {
			campaigns = append(campaigns, o.CampaignID)
		}
	}
	results := make([]error, n)
	returned := make(map[string]bool, n)
	insert := func(sql string) error {
		inserted, err := m.l.pool.Query(ctx, sql, ids, camps, skus, users, shards, qtys, epochs, expires, campaigns)
		if err != nil {
			return err
		}
		var id string
		_, err = pgx.ForEachRow(inserted, []any{&id}, func() error {
			returned[id] = true
			return nil
		})
		return err
	}
	err := insert(sqlInsertPending)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == uniqueViolation {
		// Refused as a whole: nothing of this batch was written.
		clear(returned)
		err = insert(sqlInsertPendingSkipDuplicates)
	}
	if err != nil {
		// A statement the server refused, or one never sent, changed nothing;
		// any other failure may have hit the implicit commit.
		var pgErr *pgconn.PgError
		definite := errors.As(err, &pgErr) || pgconn.SafeToRetry(err)
		for i, r := range rows {
			if definite {
				results[i] = fmt.Errorf("ledger: materialize %s: %w", r.o.ReservationID, err)
			} else {
				results[i] = fmt.Errorf("%w: %s: %w", ErrAmbiguous, r.o.ReservationID, err)
			}
		}
		return results
	}
	var skipped []string
	for _, r := range rows {
		if !returned[r.o.ReservationID] {
			skipped = append(skipped, r.o.ReservationID)
		}
	}
	if len(skipped) == 0 {
		return results
	}
	// Skipped rows were certainly not written by this batch; tell duplicates from
	// fenced rows.
	existing := map[string]bool{}
	if ex, err := m.l.pool.Query(ctx, sqlExistingOrders, skipped); err == nil {
		var id string
		_, _ = pgx.ForEachRow(ex, []any{&id}, func() error {
			existing[id] = true
			return nil
		})
	}
	for i, r := range rows {
		id := r.o.ReservationID
		switch {
		case returned[id]:
		case existing[id]:
			results[i] = fmt.Errorf("%w: %s", ErrDuplicate, id)
		default:
			results[i] = fmt.Errorf("%w: %s: campaign %s is not at epoch %d (rebuilt, deleted or missing)", ErrFenced, id, r.o.CampaignID, r.o.Epoch)
		}
	}
	return results
}
