package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
SELECT t.r, $1, $2, t.u, t.sh, t.q, 'PENDING', $3, t.x, ` + requestKeyOfR + `
FROM unnest($4::text[], $5::text[], $6::integer[], $7::integer[], $8::timestamptz[]) AS t(r, u, sh, q, x)
WHERE (SELECT epoch FROM live) = $3`

// sqlInsertPendingSkipDuplicates is sqlInsertPending that skips the rows
// already present (by request key: the same reservation, or the same request
// on another shard, see 0003_request_key.sql) and returns the ids it wrote.
const sqlInsertPendingSkipDuplicates = sqlInsertPending + `
ON CONFLICT DO NOTHING
RETURNING reservation_id`

// uniqueViolation is PostgreSQL's SQLSTATE for a duplicate key.
const uniqueViolation = "23505"

// sqlExistingOrders tells, for rows the insert skipped, which already existed
// as the same reservation or the same request (duplicates); the others were
// fenced. A row of the same request has the id's request key, and a row of
// the same id from before 0003 has '.' || id (see byID1).
const sqlExistingOrders = `SELECT t.id FROM unnest($1::text[]) AS t(id)
WHERE EXISTS (SELECT 1 FROM flashsale_orders o WHERE o.campaign_id = (SELECT $2::text)
    AND o.request_key IN (split_part(t.id, '.', 2), '.' || t.id))`

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

	// The connection is taken first: failing to get one (PostgreSQL down or
	// not answering by the batch's deadline) means nothing was sent, so the
	// callers release their units at once instead of holding them until
	// they expire.
	conn, err := m.pool.Acquire(ctx)
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
		definite := changedNothing(err)
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
	// A lookup that fails leaves them a plain refusal: called fenced, they
	// would read as a rebuild's fence nobody ran.
	existing := map[string]bool{}
	var lookup error
	if len(skipped) > 0 {
		m.l.ensureStatistics(ctx)
		if testHookLookupDuplicates != nil {
			testHookLookupDuplicates(conn.Conn().PgConn().PID())
		}
		ex, err := conn.Query(ctx, sqlExistingOrders, skipped, first.CampaignID)
		if err == nil {
			var id string
			_, err = pgx.ForEachRow(ex, []any{&id}, func() error {
				existing[id] = true
				return nil
			})
		}
		lookup = err
	}
	for _, i := range idx {
		id := rows[i].o.ReservationID
		switch {
		case returned[id]:
			results[i] = nil
		case lookup != nil:
			results[i] = fmt.Errorf("ledger: materialize %s: not written, and whether it was a duplicate is unknown: %w", id, lookup)
		case existing[id]:
			results[i] = fmt.Errorf("%w: %s", ErrDuplicate, id)
		default:
			results[i] = fenced(i)
		}
	}
}

// testHookLookupDuplicates, when set by a test, runs before the lookup that
// tells skipped rows' duplicates from fenced ones, with the server process id
// of the connection it runs on.
var testHookLookupDuplicates func(pid uint32)

// changedNothing: the failed batch certainly wrote nothing, so its callers
// may give their units back. A statement the server refused with an ERROR
// changed nothing, nor did one never sent. Any other failure may have hit
// the implicit commit: a lost connection, a timeout, and a FATAL or PANIC,
// which end the session and may follow the commit (a PANIC when the
// commit's WAL flush fails leaves a record that a restart may replay), but
// for those only a session's start sends (a pooler's login to the server).
func changedNothing(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		severity := pgErr.SeverityUnlocalized // PostgreSQL 9.6 on; Severity may be translated
		if severity == "" {
			severity = pgErr.Severity
		}
		return severity != "PANIC" && (severity != "FATAL" || sessionStartCode(pgErr.Code))
	}
	return pgconn.SafeToRetry(err)
}

// sessionStartCode: a FATAL sent only before a session runs anything:
// authorization (class 28), an unknown database, too many connections, a
// server starting up or shutting down.
func sessionStartCode(code string) bool {
	switch code {
	case "3D000", "53300", "57P03":
		return true
	}
	return strings.HasPrefix(code, "28")
}
