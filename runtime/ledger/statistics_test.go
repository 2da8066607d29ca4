package ledger

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A ledger whose orders were never analyzed (a new database, autovacuum off
// or not there yet) has its first sale's expired reservations cancelled
// through their key all the same: the sweeper's first cancel, a rebuild's,
// or the writer's first lookup of duplicates analyzes the orders first.
// Without statistics, each cancel read every order of the sale (through the
// buyers' index, by the campaign alone).
func TestCancelsOfALedgerNeverAnalyzedUseTheKey(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	for _, cancel := range []string{"the sweeper's", "a rebuild's", "the writer's duplicates"} {
		t.Run(cancel, func(t *testing.T) {
			l := newLedger(t)
			if _, err := l.pool.Exec(ctx, `ALTER TABLE flashsale_orders SET (autovacuum_enabled = off)`); err != nil {
				t.Fatal(err)
			}
			sale := newCampaign(t, l, 20_000, 4)
			// The first batch finds the table empty, which has nothing to analyze.
			if _, err := l.CancelExpired(ctx, sale.ID, []string{"0.none"}, 0); err != nil {
				t.Fatal(err)
			}
			if _, err := l.pool.Exec(ctx, sqlTestBulkOrders, sale.ID, 20_000, string(StatusPending)); err != nil {
				t.Fatal(err)
			}
			rows, err := l.pool.Query(ctx, `SELECT reservation_id FROM flashsale_orders
				WHERE campaign_id = $1 ORDER BY reservation_id LIMIT 256`, sale.ID)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			byKey := func() bool {
				plan := explainPrepared(t, l, "force_custom_plan", sqlCancelExpired, sale.ID, ids, int64(0))
				return indexCondsNaming(plan, "request_key = ANY") > 0 && !strings.Contains(plan, "holder_idx")
			}
			if byKey() {
				t.Fatal("the cancel reaches the orders by their key before any statistics: the test shows nothing")
			}
			switch cancel {
			case "the sweeper's":
				got, err := l.CancelExpired(ctx, sale.ID, ids, 0)
				if err != nil || len(got) != len(ids) {
					t.Fatalf("cancel: %d statuses, %v; want %d", len(got), err, len(ids))
				}
			case "a rebuild's":
				snap, err := l.BeginRebuild(ctx, sale.ID, 0)
				if err != nil || snap.Expired != 20_000 {
					t.Fatalf("rebuild: %d expired cancelled, %v; want 20000", snap.Expired, err)
				}
			default:
				m := l.NewMaterializer(MaterializerConfig{})
				defer m.Close()
				again := pendingOrder(sale, "u", 0, time.Hour)
				again.ReservationID = ids[0]
				if err := m.Submit(ctx, again); !errors.Is(err, ErrDuplicate) {
					t.Fatalf("a row written again: %v, want ErrDuplicate", err)
				}
			}
			var analyzed bool
			if err := l.pool.QueryRow(ctx, sqlOrdersStatistics).Scan(new(bool), &analyzed); err != nil || !analyzed {
				t.Fatalf("the orders have statistics: %v (%v), want true", analyzed, err)
			}
			if !byKey() {
				t.Fatal("after the first cancel the sweeper's still reaches the orders by the campaign alone")
			}
		})
	}
}

// The orders locked against ANALYZE (autovacuum at work on them, or another
// process's ANALYZE) do not hold the sweeper's cancel: its ANALYZE gives up
// after analyzeLockTimeout, the cancel goes on, and the statistics are
// tried again later.
func TestCancelDoesNotWaitForALockedAnalyze(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	l := newLedger(t)
	sale := newCampaign(t, l, 100, 4)
	if _, err := l.pool.Exec(ctx, sqlTestBulkOrders, sale.ID, 100, string(StatusPending)); err != nil {
		t.Fatal(err)
	}
	var id string
	if err := l.pool.QueryRow(ctx, `SELECT reservation_id FROM flashsale_orders WHERE campaign_id = $1 LIMIT 1`, sale.ID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	locker, err := l.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(ctx) }()
	if _, err := locker.Exec(ctx, `LOCK TABLE flashsale_orders IN SHARE UPDATE EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		got, err := l.CancelExpired(ctx, sale.ID, []string{id}, 0)
		if err == nil && got[id] != StatusCancelledBySweeper {
			err = fmt.Errorf("status %q, want %s", got[id], StatusCancelledBySweeper)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("cancel beside a locked ANALYZE: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the cancel waits for the table lock held against ANALYZE")
	}
	if _, _, err := l.ordersStatistics(ctx); err != nil {
		t.Fatal(err)
	}
	if l.statsSeen || l.statsRetry.IsZero() {
		t.Fatalf("after a failed ANALYZE: seen %v, retry at %v; want it tried again later", l.statsSeen, l.statsRetry)
	}
}
