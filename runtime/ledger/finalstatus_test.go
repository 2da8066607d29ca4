package ledger

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// An order's status leaves PENDING once: the database refuses to change a
// final status, whoever asks (0008), with an error that names the order,
// and the refused statement changes nothing, not even the PENDING rows it
// also named. Other columns of an ended order may still change.
func TestAFinalStatusNeverChanges(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	setStatus := func(to Status, ids ...string) error {
		_, err := l.Pool().Exec(ctx, `UPDATE flashsale_orders
SET status = $2, payment_token = CASE WHEN $2 = 'COMMITTED' THEN 'pay-' || reservation_id END, updated_at = now()
WHERE reservation_id = ANY ($1)`, ids, string(to))
		return err
	}
	final := []Status{StatusCommitted, StatusCancelledBySweeper, StatusCancelledByUser, StatusAbandoned}
	for _, from := range final {
		o := pendingOrder(c, "u", 0, 0)
		o.Status = from
		if from == StatusCommitted {
			o.PaymentToken = "pay"
		}
		o = insertOrder(t, l, o, -time.Minute)
		pending := insertOrder(t, l, pendingOrder(c, "v", 1, 0), time.Hour)
		for _, to := range append([]Status{StatusPending}, final...) {
			if to == from {
				continue
			}
			err := setStatus(to, pending.ReservationID, o.ReservationID)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" ||
				!strings.Contains(pgErr.Message, o.ReservationID) || !strings.Contains(pgErr.Message, string(from)) {
				t.Errorf("%s -> %s: %v; want a check violation naming the order and its status", from, to, err)
			}
			mustStatus(t, l, o.ReservationID, from)
			mustStatus(t, l, pending.ReservationID, StatusPending)
		}
		// The same status again, or another column: left alone.
		if _, err := l.Pool().Exec(ctx, `UPDATE flashsale_orders SET status = status, updated_at = now() WHERE reservation_id = $1`,
			o.ReservationID); err != nil {
			t.Errorf("%s: an update that keeps the status: %v", from, err)
		}
		// A PENDING order still ends, by hand too.
		if err := setStatus(StatusCancelledByUser, pending.ReservationID); err != nil {
			t.Errorf("PENDING -> CANCELLED_BY_USER: %v", err)
		}
	}
	mustCountsAgree(t, l, c)
}
