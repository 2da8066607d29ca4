package ledger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Order is one flashsale_orders row.
type Order struct {
	ReservationID string
	CampaignID    string
	SKU           string
	UserID        string
	Shard         int
	Quantity      int
	Status        Status
	Epoch         int64
	ExpiresAt     time.Time
	PaymentToken  string // empty unless COMMITTED
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// querier is what both the pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// maxRaceRetries bounds how often a conditional update is retried when the
// follow-up read finds a row that should have matched (it was inserted
// between the two statements by a late materializer batch).
const maxRaceRetries = 3

// The statements that look up a sale's orders by key name the sale as
// (SELECT $n::text), a value the planner cannot see. With the value in sight
// it plans from the sale's own statistics, and a sale too new for them
// (autoanalyze follows the whole table, and with fewer sales than the
// statistics' list of common values an unlisted one counts as one row) got
// scans of the whole sale for each checkout, lookup and batch, or worse. Out
// of sight, the sale counts as an average one, and each lookup takes the
// index of its key.
const (
	orderColumns = `reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at,
    payment_token, created_at, updated_at`

	sqlGetOrder = `SELECT ` + orderColumns + ` FROM flashsale_orders WHERE campaign_id = (SELECT $1::text) AND ` + byID2

	// I7: commits only while the lease is valid by the database clock, so a
	// payment racing the sweeper either commits first or finds the row gone.
	// The clock is read when the row is reached, not when the statement
	// started: a checkout held past the expiry (a lock wait) must not commit
	// once a retry of it has been told "expired" (sqlExpiredCheckout). A
	// payment already told to be voided never commits: the clock may step
	// back (NTP, a failover to a primary behind) while the row is PENDING.
	sqlCheckout = `UPDATE flashsale_orders
SET status = 'COMMITTED', payment_token = $4, updated_at = now()
WHERE ` + byID1 + ` AND campaign_id = (SELECT $2::text) AND user_id = $3
  AND status = 'PENDING' AND expires_at > clock_timestamp()
  AND NOT EXISTS (SELECT 1 FROM flashsale_late_payments p
                  WHERE p.reservation_id = $1 AND p.payment_token = $4 AND p.campaign_id = $2)
RETURNING ` + orderColumns

	sqlLatePaymentRecorded = `SELECT EXISTS (SELECT 1 FROM flashsale_late_payments
WHERE reservation_id = $1 AND payment_token = $3 AND campaign_id = $2)`

	// A checkout that finds its reservation PENDING and expired writes the
	// row (changing nothing) before it answers "expired, void the payment".
	// The write waits for a checkout of the row in flight, and reads what it
	// committed; and a checkout that reaches the row later re-reads it, and
	// the clock, and finds it expired too. A plain read could answer
	// "expired" while an earlier attempt of the same payment, started before
	// the expiry, went on to commit it.
	sqlExpiredCheckout = `UPDATE flashsale_orders SET updated_at = updated_at
WHERE ` + byID1 + ` AND campaign_id = (SELECT $2::text) AND user_id = $3
  AND status = 'PENDING' AND expires_at <= clock_timestamp()
RETURNING ` + orderColumns

	sqlRecordLatePayment = `INSERT INTO flashsale_late_payments (reservation_id, campaign_id, user_id, payment_token, order_status)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (reservation_id, payment_token) DO NOTHING`

	sqlCancelByUser = `UPDATE flashsale_orders
SET status = 'CANCELLED_BY_USER', updated_at = now()
WHERE ` + byID1 + ` AND campaign_id = (SELECT $2::text) AND user_id = $3 AND status = 'PENDING'
RETURNING ` + orderColumns

	// Grace is passed in microseconds: an exact integer, no interval parsing.
	// The rows are locked in reservation id order (the same order as the
	// rebuild's cancel), so two sweepers and a rebuild cannot deadlock on
	// each other whatever plan each statement gets. The locked rows' request
	// keys go to the update as one array it looks up in the primary key: a
	// join of the orders to them could be planned as a loop over the whole
	// sale for each of them.
	//
	// The same statement reads every id's status: the cancelled rows from
	// the update, the others as the statement's snapshot has them (it cannot
	// see its own update), looked up by the ids not cancelled only. A row
	// that a transaction committing after the statement began ended (a
	// checkout, a buyer's cancel, another sweeper, a rebuild) reads PENDING,
	// and the sweeper skips it for this pass; one it inserted reads missing
	// (the sweeper's RecordAbandoned then finds it). Rows only ever leave
	// PENDING, so no other status read is stale.
	sqlCancelExpired = `WITH cancelled AS (
UPDATE flashsale_orders
SET status = 'CANCELLED_BY_SWEEPER', updated_at = now()
WHERE campaign_id = (SELECT $1::text) AND status = 'PENDING' AND request_key = ANY (ARRAY(
    SELECT request_key FROM flashsale_orders
    WHERE campaign_id = (SELECT $1::text) AND ` + byIDs2 + `
      AND status = 'PENDING' AND expires_at + $3::bigint * interval '1 microsecond' < now()
    ORDER BY reservation_id
    FOR UPDATE))
RETURNING reservation_id, status)
SELECT reservation_id, status FROM cancelled
UNION ALL
SELECT reservation_id, status FROM flashsale_orders
WHERE campaign_id = (SELECT $1::text) AND request_key = ANY (ARRAY(
    SELECT k FROM unnest($2::text[]) AS i(id),
        LATERAL (VALUES (split_part(i.id, '.', 2)), ('.' || i.id)) AS v(k)
    WHERE i.id NOT IN (SELECT reservation_id FROM cancelled)))
  AND reservation_id = ANY ($2::text[])`

	// Pairs of (campaign, reservation id). The keys are an array: an IN
	// list naming t's columns is planned as an OR, and the orders scanned.
	sqlStatusesAnyCampaign = `SELECT o.reservation_id, o.status
FROM unnest($1::text[], $2::text[]) AS t(c, r)
JOIN flashsale_orders o ON o.campaign_id = t.c
    AND o.request_key = ANY (ARRAY[split_part(t.r, '.', 2), '.' || t.r]) AND o.reservation_id = t.r`

	// A row of the same request on another shard (request_key) also wins:
	// the reservation abandoned then has no row, and is released.
	sqlInsertAbandoned = `INSERT INTO flashsale_orders
    (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at, request_key)
SELECT t.r, t.c, t.s, t.u, t.sh, t.q, 'ABANDONED', t.e, t.x, ` + requestKeyOfR + `
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::integer[], $6::integer[], $7::bigint[], $8::timestamptz[])
    AS t(r, c, s, u, sh, q, e, x)
ON CONFLICT DO NOTHING
RETURNING reservation_id`
)

// The orders' primary key is (campaign, request key), and a reservation id
// is "<shard>.<request key>": a row's request key is the id's part after its
// first dot, or '.' || id for a duplicate written before 0003 and for an id
// without a dot (0007_request_primary_key.sql). An order is found by id
// through the primary key by naming both keys the row may have, and the id.
const (
	byID1 = `request_key IN (split_part($1, '.', 2), '.' || $1) AND reservation_id = $1`
	byID2 = `request_key IN (split_part($2, '.', 2), '.' || $2) AND reservation_id = $2`
	// byIDs2 is byID1 for the array of ids $2.
	byIDs2 = `request_key = ANY (ARRAY(SELECT k FROM unnest($2::text[]) AS i(id),
        LATERAL (VALUES (split_part(i.id, '.', 2)), ('.' || i.id)) AS v(k)))
      AND reservation_id = ANY ($2::text[])`
	// requestKeyOfR is the request key a writer gives the row of the
	// reservation id t.r.
	requestKeyOfR = `coalesce(nullif(split_part(t.r, '.', 2), ''), '.' || t.r)`
)

func scanOrder(row pgx.Row) (Order, error) {
	var o Order
	var status string
	var token *string
	if err := row.Scan(&o.ReservationID, &o.CampaignID, &o.SKU, &o.UserID, &o.Shard, &o.Quantity,
		&status, &o.Epoch, &o.ExpiresAt, &token, &o.CreatedAt, &o.UpdatedAt); err != nil {
		return Order{}, err
	}
	o.Status = Status(status)
	if token != nil {
		o.PaymentToken = *token
	}
	return o, nil
}

// GetOrder returns the campaign's order or ErrNotFound.
func (l *Ledger) GetOrder(ctx context.Context, campaignID, reservationID string) (Order, error) {
	o, err := scanOrder(l.pool.QueryRow(ctx, sqlGetOrder, campaignID, reservationID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, fmt.Errorf("%w: reservation %s", ErrNotFound, reservationID)
	}
	if err != nil {
		return Order{}, fmt.Errorf("ledger: get order %s: %w", reservationID, err)
	}
	return o, nil
}

// getOwnOrder reads the row for a follow-up decision; found is false when the
// row is missing or belongs to another campaign or user, which callers must
// not be able to tell apart.
func (l *Ledger) getOwnOrder(ctx context.Context, campaignID, reservationID, userID string) (o Order, found bool, err error) {
	o, err = scanOrder(l.pool.QueryRow(ctx, sqlGetOrder, campaignID, reservationID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, false, nil
	}
	if err != nil {
		return Order{}, false, err
	}
	if o.CampaignID != campaignID || o.UserID != userID {
		return Order{}, false, nil
	}
	return o, true, nil
}

// CheckoutOutcome says what Checkout did.
type CheckoutOutcome int

const (
	// CheckoutCommitted: PENDING → COMMITTED by this call.
	CheckoutCommitted CheckoutOutcome = iota + 1
	// CheckoutAlreadyCommitted: committed earlier with the same payment token (idempotent retry).
	CheckoutAlreadyCommitted
	// CheckoutConflict: committed earlier with another payment token. This
	// token is recorded in flashsale_late_payments (order_status COMMITTED):
	// a second payment for one order must be voided too.
	CheckoutConflict
	// CheckoutExpired: expired by the database clock, or cancelled or
	// abandoned; NOT committed. The payment token is recorded in
	// flashsale_late_payments so the payment can be voided.
	CheckoutExpired
	// CheckoutNotFound: no such reservation for this campaign and user.
	CheckoutNotFound
)

func (o CheckoutOutcome) String() string {
	switch o {
	case CheckoutCommitted:
		return "committed"
	case CheckoutAlreadyCommitted:
		return "already-committed"
	case CheckoutConflict:
		return "conflict"
	case CheckoutExpired:
		return "expired"
	case CheckoutNotFound:
		return "not-found"
	}
	return fmt.Sprintf("CheckoutOutcome(%d)", int(o))
}

// Checkout commits the reservation for its own user while its lease is valid
// by the database clock. A reservation of another user is reported as not
// found, so ids cannot be probed.
func (l *Ledger) Checkout(ctx context.Context, campaignID, reservationID, userID, paymentToken string) (CheckoutOutcome, Order, error) {
	if paymentToken == "" {
		// The token is what makes retries idempotent and lets a late payment be voided.
		return 0, Order{}, errors.New("ledger: checkout without payment token")
	}
	for range maxRaceRetries {
		o, err := scanOrder(l.pool.QueryRow(ctx, sqlCheckout, reservationID, campaignID, userID, paymentToken))
		if err == nil {
			return CheckoutCommitted, o, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return 0, Order{}, fmt.Errorf("ledger: checkout %s: %w", reservationID, err)
		}
		o, err = scanOrder(l.pool.QueryRow(ctx, sqlExpiredCheckout, reservationID, campaignID, userID))
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return 0, Order{}, fmt.Errorf("ledger: checkout %s: %w", reservationID, err)
		}
		if err != nil {
			// Not PENDING and expired: paid, cancelled, not yet expired (a
			// row inserted after the update looked), another user's or none.
			var found bool
			if o, found, err = l.getOwnOrder(ctx, campaignID, reservationID, userID); err != nil {
				return 0, Order{}, fmt.Errorf("ledger: checkout %s: %w", reservationID, err)
			}
			switch {
			case !found:
				return CheckoutNotFound, Order{}, nil
			case o.Status == StatusCommitted && o.PaymentToken == paymentToken:
				return CheckoutAlreadyCommitted, o, nil
			case o.Status == StatusPending:
				var late bool
				if err := l.pool.QueryRow(ctx, sqlLatePaymentRecorded, reservationID, campaignID, paymentToken).Scan(&late); err != nil {
					return 0, Order{}, fmt.Errorf("ledger: checkout %s: %w", reservationID, err)
				}
				if late {
					return CheckoutExpired, o, nil // told before, by a clock since stepped back
				}
				continue // changed between the statements; try again
			}
		}
		// Paid with another token, expired, cancelled or abandoned: this
		// payment sold nothing, and the money must go back.
		if _, err := l.pool.Exec(ctx, sqlRecordLatePayment, reservationID, campaignID, userID, paymentToken, string(o.Status)); err != nil {
			return 0, Order{}, fmt.Errorf("ledger: record late payment %s: %w", reservationID, err)
		}
		if o.Status == StatusCommitted {
			return CheckoutConflict, o, nil
		}
		return CheckoutExpired, o, nil
	}
	return 0, Order{}, fmt.Errorf("ledger: checkout %s: row kept changing", reservationID)
}

// CancelOutcome says what CancelByUser did.
type CancelOutcome int

const (
	// CancelCancelled: PENDING → CANCELLED_BY_USER by this call; release the unit.
	CancelCancelled CancelOutcome = iota + 1
	// CancelAlreadyCancelled: the row already says CANCELLED_BY_USER (a retry;
	// the release is idempotent, so release again).
	CancelAlreadyCancelled
	// CancelCommitted: refused, the reservation was paid for.
	CancelCommitted
	// CancelNotFound: no such reservation for this campaign and user.
	CancelNotFound
	// CancelGone: already cancelled by the sweeper or abandoned.
	CancelGone
)

func (o CancelOutcome) String() string {
	switch o {
	case CancelCancelled:
		return "cancelled"
	case CancelAlreadyCancelled:
		return "already-cancelled"
	case CancelCommitted:
		return "committed"
	case CancelNotFound:
		return "not-found"
	case CancelGone:
		return "gone"
	}
	return fmt.Sprintf("CancelOutcome(%d)", int(o))
}

// CancelByUser cancels the user's own PENDING reservation (SQL first; the
// caller releases the Redis unit afterwards). Expired but unswept
// reservations may still be cancelled: whichever of user and sweeper wins the
// update releases.
func (l *Ledger) CancelByUser(ctx context.Context, campaignID, reservationID, userID string) (CancelOutcome, Order, error) {
	for range maxRaceRetries {
		o, err := scanOrder(l.pool.QueryRow(ctx, sqlCancelByUser, reservationID, campaignID, userID))
		if err == nil {
			return CancelCancelled, o, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return 0, Order{}, fmt.Errorf("ledger: cancel %s: %w", reservationID, err)
		}
		o, found, err := l.getOwnOrder(ctx, campaignID, reservationID, userID)
		if err != nil {
			return 0, Order{}, fmt.Errorf("ledger: cancel %s: %w", reservationID, err)
		}
		if !found {
			return CancelNotFound, Order{}, nil
		}
		switch o.Status {
		case StatusCommitted:
			return CancelCommitted, o, nil
		case StatusCancelledByUser:
			return CancelAlreadyCancelled, o, nil
		case StatusCancelledBySweeper, StatusAbandoned:
			return CancelGone, o, nil
		case StatusPending:
			continue // inserted after the update looked; try again
		default:
			return 0, o, fmt.Errorf("ledger: cancel %s: unknown status %q", reservationID, o.Status)
		}
	}
	return 0, Order{}, fmt.Errorf("ledger: cancel %s: row kept changing", reservationID)
}

// CancelExpired is the sweeper's SQL-first step: PENDING rows of ids whose
// expires_at + grace has passed (database clock) become
// CANCELLED_BY_SWEEPER. It returns the status of every id whose row in this
// campaign the statement's snapshot holds, so a sweeper that crashed after
// this update and before the Redis release still sees CANCELLED_BY_SWEEPER
// and releases. A row another writer ended or inserted meanwhile reads
// PENDING or missing (sqlCancelExpired).
func (l *Ledger) CancelExpired(ctx context.Context, campaignID string, ids []string, grace time.Duration) (map[string]Status, error) {
	if len(ids) == 0 {
		return map[string]Status{}, nil
	}
	if grace < 0 {
		grace = 0
	}
	l.ensureStatistics(ctx)
	out, err := collectStatuses(l.pool.Query(ctx, sqlCancelExpired, campaignID, ids, grace.Microseconds()))
	if err != nil {
		return nil, fmt.Errorf("ledger: cancel expired: %w", err)
	}
	return out, nil
}

// RecordAbandoned writes ABANDONED rows for reservations that Redis holds but
// the ledger does not (the API died between Redis and SQL), unless a row
// exists by now. It returns the current status of each id: ABANDONED when
// this or another sweeper recorded it, anything else (PENDING) when a late
// materializer batch won, in which case the unit must not be released; and
// how many rows this call wrote (another sweeper, a replica still leading a
// pass after its lease moved, may have written the others). The rows it
// wrote need no second statement.
func (l *Ledger) RecordAbandoned(ctx context.Context, orders []Order) (status map[string]Status, wrote int, err error) {
	if len(orders) == 0 {
		return map[string]Status{}, 0, nil
	}
	// Sorted so that two sweepers inserting overlapping sets take the
	// primary-key locks in the same order and cannot deadlock.
	orders = slices.Clone(orders)
	slices.SortFunc(orders, func(a, b Order) int { return byRequest(a.ReservationID, b.ReservationID) })
	n := len(orders)
	ids, campaigns, skus, users := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	shards, qtys := make([]int32, n), make([]int32, n)
	epochs, expires := make([]int64, n), make([]time.Time, n)
	for i, o := range orders {
		if o.ReservationID == "" || o.CampaignID == "" || o.Quantity <= 0 || o.Shard < 0 {
			return nil, 0, fmt.Errorf("ledger: record abandoned: invalid order %+v", o)
		}
		ids[i], campaigns[i], skus[i], users[i] = o.ReservationID, o.CampaignID, o.SKU, o.UserID
		shards[i], qtys[i] = int32(o.Shard), int32(o.Quantity)
		epochs[i], expires[i] = o.Epoch, o.ExpiresAt
	}
	var written []string
	rows, err := l.pool.Query(ctx, sqlInsertAbandoned, ids, campaigns, skus, users, shards, qtys, epochs, expires)
	if err == nil {
		written, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: record abandoned: %w", err)
	}
	status = make(map[string]Status, n)
	for _, id := range written {
		status[id] = StatusAbandoned
	}
	if len(written) == n {
		return status, n, nil
	}
	var otherCampaigns, otherIDs []string
	for i, id := range ids {
		if _, ok := status[id]; !ok {
			otherCampaigns, otherIDs = append(otherCampaigns, campaigns[i]), append(otherIDs, id)
		}
	}
	others, err := collectStatuses(l.pool.Query(ctx, sqlStatusesAnyCampaign, otherCampaigns, otherIDs))
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: record abandoned: %w", err)
	}
	maps.Copy(status, others)
	return status, len(written), nil
}

func collectStatuses(rows pgx.Rows, err error) (map[string]Status, error) {
	if err != nil {
		return nil, err
	}
	out := map[string]Status{}
	var id, status string
	_, err = pgx.ForEachRow(rows, []any{&id, &status}, func() error {
		out[id] = Status(status)
		return nil
	})
	return out, err
}

// sqlHeldBy reads a buyer's held and paid orders of one sale through the
// holders' index, which holds exactly those (0002). A buyer
// holds at most maxPerUser units (100 at most in a FlashSale), one or more
// a reservation; the LIMIT bounds the answer whatever the flag says.
const sqlHeldBy = `SELECT ` + orderColumns + ` FROM flashsale_orders
WHERE campaign_id = (SELECT $1::text) AND user_id = $2 AND status IN ('PENDING', 'COMMITTED')
ORDER BY created_at, expires_at, reservation_id
LIMIT 1000`

// HeldBy returns the orders the user holds in the campaign, PENDING and
// COMMITTED, oldest first (a batch's rows share created_at; their expiry
// keeps the order they were reserved in, to the millisecond), at most 1000.
// A PENDING order past its expiry is still held until the sweeper cancels
// it: a checkout refuses it, a cancel still takes it, and it counts against
// the buyer's limit until then.
func (l *Ledger) HeldBy(ctx context.Context, campaignID, userID string) ([]Order, error) {
	rows, err := l.pool.Query(ctx, sqlHeldBy, campaignID, userID)
	if err != nil {
		return nil, fmt.Errorf("ledger: orders held by a user: %w", err)
	}
	orders, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Order, error) { return scanOrder(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: orders held by a user: %w", err)
	}
	return orders, nil
}
