// Package salecheck holds the checks the end-to-end suites (test/e2e on the
// pod runner, test/node on a real node) make of a sale after a storm or a
// fault: the storm's audit, the acknowledged reservations in the ledger, the
// ledger's units, processes gone; and the sequences both run against a Sale
// with its buyers (a Redis loss and the rebuild, a sweep across killed
// sweepers, a scheduled drop, the status agreeing with the ledger).
package salecheck

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
)

// Querier is the ledger connection the checks read through (a pgxpool.Pool,
// a pgx.Conn).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// queryTimeout bounds each of the checks' ledger queries.
const queryTimeout = time.Minute

// Audit fails the test unless the storm's audit passed and is exact (I1-I7
// as far as a storm sees them).
func Audit(t testing.TB, rep *storm.Report) {
	t.Helper()
	a := rep.Audit
	switch {
	case a == nil:
		t.Fatal("the storm ran no audit")
	case !rep.OK || !a.OK || len(a.Failures) > 0:
		t.Fatalf("audit failed: %v; idempotency violations %v", a.Failures, rep.IdempotencyViolations)
	case !a.Conserved || a.Available+a.Reserved+a.Sold != a.Allocation:
		t.Fatalf("not conserved: available %d + reserved %d + sold %d != %d", a.Available, a.Reserved, a.Sold, a.Allocation)
	case a.Oversold != 0 || a.Sold > a.Allocation:
		t.Fatalf("oversold: sold %d of %d", a.Sold, a.Allocation)
	case a.AckedInLedger != a.Acked || a.Acked != rep.Acked:
		t.Fatalf("%d of %d acknowledged reservations in the ledger", a.AckedInLedger, a.Acked)
	case a.ConfirmedCommitted != a.Confirmed:
		t.Fatalf("%d of %d confirmed checkouts committed", a.ConfirmedCommitted, a.Confirmed)
	case rep.Acked == 0:
		t.Fatal("the storm got no reservation at all")
	}
}

// Acked fails the test unless every reservation id in a storm's
// --acked-file (acked of them, the report says) has a ledger row that is not
// ABANDONED.
func Acked(t testing.TB, q Querier, ackedFile string, acked int) {
	t.Helper()
	b, err := os.ReadFile(ackedFile)
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Fields(string(b))
	if len(ids) != acked {
		t.Fatalf("%d acknowledged ids in --acked-file, the report says %d", len(ids), acked)
	}
	statuses := Statuses(t, q, ids)
	lost := 0
	for _, id := range ids {
		if s, ok := statuses[id]; !ok || s == "ABANDONED" {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged reservation %s: ledger status %q", id, s)
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged reservations lost", lost, len(ids))
	}
}

// Statuses returns the ledger status of each reservation id that has a row.
func Statuses(t testing.TB, q Querier, ids []string) map[string]string {
	t.Helper()
	return scan(t, q, `SELECT reservation_id, status FROM flashsale_orders WHERE reservation_id = ANY($1)`, ids,
		func(rows pgx.Rows, out map[string]string) error {
			var id, status string
			err := rows.Scan(&id, &status)
			out[id] = status
			return err
		})
}

// Units sums a sale's order units by ledger status.
func Units(t testing.TB, q Querier, uid string) map[string]int64 {
	t.Helper()
	return scan(t, q, `SELECT status, sum(quantity)::bigint FROM flashsale_orders WHERE campaign_id = $1 GROUP BY status`, uid,
		func(rows pgx.Rows, out map[string]int64) error {
			var status string
			var n int64
			err := rows.Scan(&status, &n)
			out[status] = n
			return err
		})
}

func scan[V any](t testing.TB, q Querier, sql string, arg any, row func(pgx.Rows, map[string]V) error) map[string]V {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	rows, err := q.Query(ctx, sql, arg)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]V{}
	for rows.Next() {
		if err := row(rows, out); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Alive tells whether a pid is a live (not zombie) process.
func Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// KeptAfterDeletion fails the test unless a deleted sale's ledger still holds
// the orders it held before the deletion (before, from Units), some of them
// paid, and marks its campaign deleted.
func KeptAfterDeletion(t testing.TB, q Querier, uid string, before map[string]int64) {
	t.Helper()
	after := Units(t, q, uid)
	if fmt.Sprint(after) != fmt.Sprint(before) || after["COMMITTED"] == 0 {
		t.Errorf("ledger before the deletion %v, after %v: orders must be kept", before, after)
	}
	deleted := scan(t, q, `SELECT campaign_id, deleted_at IS NOT NULL FROM flashsale_campaigns WHERE campaign_id = $1`, uid,
		func(rows pgx.Rows, out map[string]bool) error {
			var id string
			var d bool
			err := rows.Scan(&id, &d)
			out[id] = d
			return err
		})
	if !deleted[uid] {
		t.Error("the ledger campaign is not marked deleted")
	}
}
