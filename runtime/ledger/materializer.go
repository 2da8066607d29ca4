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
	MaxWait     time.Duration
	Concurrency int // batches in flight at once; default 2 (batches grow with load)
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
// inserted; rows that already exist are skipped. Neither kind is returned.
const sqlInsertPending = `WITH live AS (
    SELECT campaign_id, epoch FROM flashsale_campaigns
    WHERE campaign_id = ANY($9::text[]) AND deleted_at IS NULL
    ORDER BY campaign_id
    FOR SHARE)
INSERT INTO flashsale_orders
    (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at)
SELECT t.r, t.c, t.s, t.u, t.sh, t.q, 'PENDING', t.e, t.x
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::integer[], $6::integer[], $7::bigint[], $8::timestamptz[])
    AS t(r, c, s, u, sh, q, e, x)
JOIN live ON live.campaign_id = t.c AND live.epoch = t.e
ON CONFLICT (reservation_id) DO NOTHING
RETURNING reservation_id`

// sqlExistingOrders tells, for rows the insert skipped, which already existed
// (duplicates); the others were fenced.
const sqlExistingOrders = `SELECT reservation_id FROM flashsale_orders WHERE reservation_id = ANY($1::text[])`

// Materializer writes PENDING order rows in batches: many concurrent Submits
// share one transaction, so PostgreSQL sees a few commits per millisecond
// instead of one per reservation.
type Materializer struct {
	l   *Ledger
	cfg MaterializerConfig

	// mu orders Submit's queue send against Close's close(queue).
	mu     sync.RWMutex
	closed bool

	queue chan *pendingRow
	wg    sync.WaitGroup
	once  sync.Once
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
		l:     l,
		cfg:   cfg,
		queue: make(chan *pendingRow, cfg.MaxBatch*cfg.Concurrency),
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
// A ctx cancelled before the row's batch is sent means not written. Once the
// batch is sent Submit waits for it (at most cfg.Timeout) even if ctx ends,
// because only then is the outcome known. o.Status must be empty or PENDING.
func (m *Materializer) Submit(ctx context.Context, o Order) error {
	if err := validatePending(o); err != nil {
		return err
	}
	r := &pendingRow{ctx: ctx, o: o, res: make(chan error, 1)}
	m.mu.RLock()
	if m.closed {
		m.mu.RUnlock()
		return ErrClosed
	}
	select {
	case m.queue <- r:
		m.mu.RUnlock()
	case <-ctx.Done():
		m.mu.RUnlock()
		return fmt.Errorf("ledger: materialize %s: not sent: %w", o.ReservationID, ctx.Err())
	}
	return <-r.res
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

// Close writes what is already queued, then stops the writer. Submit after
// Close returns ErrClosed. Close is idempotent.
func (m *Materializer) Close() {
	m.once.Do(func() {
		m.mu.Lock()
		m.closed = true
		close(m.queue)
		m.mu.Unlock()
	})
	m.wg.Wait()
}

// work takes the first queued row, then whatever else is queued (up to MaxBatch,
// lingering MaxWait when set), and writes them in one transaction. This is group
// commit without a timer: a lone reservation is written at once, and under load
// the queue fills while the workers are busy, so batches grow with the load.
func (m *Materializer) work() {
	defer m.wg.Done()
	var timer *time.Timer
	if m.cfg.MaxWait > 0 {
		timer = time.NewTimer(0)
		<-timer.C
	}
	for {
		first, ok := <-m.queue
		if !ok {
			return
		}
		batch := make([]*pendingRow, 1, m.cfg.MaxBatch)
		batch[0] = first
	drain:
		for len(batch) < m.cfg.MaxBatch {
			select {
			case r, ok := <-m.queue:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		if timer != nil && len(batch) < m.cfg.MaxBatch {
			timer.Reset(m.cfg.MaxWait)
		linger:
			for len(batch) < m.cfg.MaxBatch {
				select {
				case r, ok := <-m.queue:
					if !ok {
						break linger
					}
					batch = append(batch, r)
				case <-timer.C:
					break linger
				}
			}
			timer.Stop()
		}
		m.write(batch)
	}
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
	inserted, err := m.l.pool.Query(ctx, sqlInsertPending, ids, camps, skus, users, shards, qtys, epochs, expires, campaigns)
	returned := make(map[string]bool, n)
	if err == nil {
		var id string
		_, err = pgx.ForEachRow(inserted, []any{&id}, func() error {
			returned[id] = true
			return nil
		})
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
