package ledger

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// purgeStatements are the two SQL blocks of docs/ledger.md's "Purging a
// deleted sale", with psql's :'sale' written as sale's literal.
func purgeStatements(t *testing.T, sale string) (orders, rest string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testharness.RepoRoot(), "docs", "ledger.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Purging a deleted sale")
	if !ok {
		t.Fatal(`docs/ledger.md has no "Purging a deleted sale"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks []string
	for _, part := range strings.Split(section, "```sql\n")[1:] {
		block, _, _ := strings.Cut(part, "```")
		blocks = append(blocks, strings.ReplaceAll(block, ":'sale'", "'"+sale+"'"))
	}
	if len(blocks) != 2 {
		t.Fatalf("docs/ledger.md gives %d SQL blocks for a purge, want 2", len(blocks))
	}
	return blocks[0], blocks[1]
}

// The purge that docs/ledger.md gives takes every row of one deleted sale,
// in batches, and refuses a sale that is not deleted; another sale's rows
// and counts stay as they were.
func TestThePurgeOfTheDocsTakesOneDeletedSale(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	gone, kept := newCampaign(t, l, 20_000, 4), newCampaign(t, l, 100, 4)
	for _, c := range []Campaign{gone, kept} {
		if _, err := l.pool.Exec(ctx, sqlTestBulkOrders, c.ID, 12_000, string(StatusCommitted)); err != nil {
			t.Fatal(err)
		}
		o := insertOrder(t, l, pendingOrder(c, "late", 0, 0), -time.Second)
		if got, _, err := l.Checkout(ctx, c.ID, o.ReservationID, "late", "pay-late"); err != nil || got != CheckoutExpired {
			t.Fatalf("late payment: %v %v", got, err)
		}
		if _, _, err := l.PlanAllocationIncrease(ctx, c.ID, c.Allocation+10); err != nil {
			t.Fatal(err)
		}
	}
	keptCounts, err := l.CountsByShard(ctx, kept.ID, kept.Shards)
	if err != nil {
		t.Fatal(err)
	}
	rows := func(c Campaign) map[string]int {
		t.Helper()
		out := map[string]int{}
		for _, table := range []string{"flashsale_orders", "flashsale_late_payments", "flashsale_shard_counts",
			"flashsale_allocation_changes", "flashsale_shards", "flashsale_campaigns"} {
			var n int
			if err := l.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE campaign_id = $1`, c.ID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			out[table] = n
		}
		return out
	}
	keptRows := rows(kept)

	// A sale that is not deleted is refused, and nothing of it goes.
	orders, rest := purgeStatements(t, kept.ID)
	if tag, err := l.pool.Exec(ctx, orders); err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("the orders' purge of a live sale: %v, %v; want nothing deleted", tag, err)
	}
	if _, err := l.pool.Exec(ctx, rest); err == nil || !strings.Contains(err.Error(), "is not a deleted sale") {
		t.Fatalf("the purge of a live sale: %v; want it refused", err)
	}

	if err := l.MarkCampaignDeleted(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	orders, rest = purgeStatements(t, gone.ID)
	if _, err := l.pool.Exec(ctx, rest); err == nil || !strings.Contains(err.Error(), "still has orders") {
		t.Fatalf("the purge before the orders: %v; want it refused", err)
	}
	batches := 0
	for {
		tag, err := l.pool.Exec(ctx, orders)
		if err != nil {
			t.Fatal(err)
		}
		if tag.RowsAffected() == 0 {
			break
		}
		batches++
	}
	if batches != 2 {
		t.Fatalf("%d batches for 12,001 orders, want 2 of at most 10,000", batches)
	}
	if _, err := l.pool.Exec(ctx, rest); err != nil {
		t.Fatal(err)
	}
	for table, n := range rows(gone) {
		if n != 0 {
			t.Errorf("%s keeps %d rows of the purged sale", table, n)
		}
	}
	if got := rows(kept); !maps.Equal(got, keptRows) {
		t.Errorf("the other sale's rows went from %v to %v", keptRows, got)
	}
	if got, err := l.CountsByShard(ctx, kept.ID, kept.Shards); err != nil || !slices.Equal(got, keptCounts) {
		t.Errorf("the other sale's counts went from %v to %v (%v)", keptCounts, got, err)
	}
}
