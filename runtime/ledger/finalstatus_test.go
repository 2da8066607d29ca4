package ledger

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// An order's status leaves PENDING once: the database refuses to change a
// final status, whoever asks (0008), with an error that names the order,
// and the refused statement changes nothing, the per-shard counts included.
// Other columns of an ended order may still change.
func TestAFinalStatusNeverChanges(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	for _, from := range []Status{StatusCommitted, StatusCancelledBySweeper, StatusCancelledByUser, StatusAbandoned} {
		o := pendingOrder(c, "u", 0, 0)
		o.Status = from
		if from == StatusCommitted {
			o.PaymentToken = "pay"
		}
		o = insertOrder(t, l, o, -time.Minute)
		for _, to := range []Status{StatusPending, StatusCommitted, StatusCancelledBySweeper, StatusAbandoned} {
			if to == from {
				continue
			}
			countsBefore := mustCountsAgree(t, l, c)
			_, err := l.Pool().Exec(ctx, `UPDATE flashsale_orders
SET status = $2, payment_token = CASE WHEN $2 = 'COMMITTED' THEN 'pay' END, updated_at = now()
WHERE reservation_id = $1`, o.ReservationID, string(to))
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" ||
				!strings.Contains(pgErr.Message, o.ReservationID) || !strings.Contains(pgErr.Message, string(from)) {
				t.Errorf("%s -> %s: %v; want a check violation naming the order and its status", from, to, err)
			}
			mustStatus(t, l, o.ReservationID, from)
			if after := mustCountsAgree(t, l, c); !slices.Equal(after, countsBefore) {
				t.Errorf("%s -> %s: the counts went from %+v to %+v", from, to, countsBefore, after)
			}
		}
		// The same status again, or another column: left alone.
		if _, err := l.Pool().Exec(ctx, `UPDATE flashsale_orders SET status = status, updated_at = now() WHERE reservation_id = $1`,
			o.ReservationID); err != nil {
			t.Errorf("%s: an update that keeps the status: %v", from, err)
		}
	}
}
