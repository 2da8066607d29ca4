package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// explained are the reads of a sale's live queries, written as runtime/ledger
// writes them (rebuild_read.go, requests.go, orders.go), with the new sale's
// values: their plans show which index each reads and how much of it.
func explained(campaign string, shards int) []struct{ name, sql string } {
	key := stock.ReservationKey(idSecret, campaign, "u1", "r")
	id := stock.FormatID(stock.HomeShard("u1", shards), key)
	c := pgx.Identifier{campaign}.Sanitize()
	c = "'" + strings.Trim(c, `"`) + "'"
	return []struct{ name, sql string }{
		{"rebuild: one shard's pending orders", `SELECT * FROM flashsale_orders WHERE campaign_id = ` + c + ` AND status = 'PENDING' AND shard = 0`},
		{"rebuild: holders", `SELECT user_id, sum(quantity)::bigint FROM flashsale_orders WHERE campaign_id = ` + c + ` AND status IN ('PENDING', 'COMMITTED') GROUP BY user_id`},
		{"request lookup", `SELECT * FROM flashsale_orders WHERE campaign_id = ` + c + ` AND request_key = '` + key + `'`},
		{"sweeper: expired of a batch", `SELECT reservation_id FROM flashsale_orders WHERE campaign_id = ` + c + ` AND request_key = ANY(ARRAY['` + key + `', '.` + id + `']) AND reservation_id = ANY(ARRAY['` + id + `']) AND status = 'PENDING' AND expires_at < now() ORDER BY reservation_id`},
		{"rebuild: all expired", `SELECT reservation_id FROM flashsale_orders WHERE campaign_id = ` + c + ` AND status = 'PENDING' AND expires_at < now() ORDER BY reservation_id`},
		{"status counts", `SELECT shard, sum(pending)::bigint, sum(committed)::bigint FROM flashsale_shard_counts WHERE campaign_id = ` + c + ` GROUP BY shard`},
	}
}

// explain returns EXPLAIN (ANALYZE, BUFFERS) of each query, in markdown.
func explain(ctx context.Context, l *ledger.Ledger, campaign string, shards int) (string, error) {
	var b strings.Builder
	for _, q := range explained(campaign, shards) {
		rows, err := l.Pool().Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+q.sql)
		if err != nil {
			return "", fmt.Errorf("explain %s: %w", q.name, err)
		}
		fmt.Fprintf(&b, "%s:\n\n```\n", q.name)
		var line string
		if _, err := pgx.ForEachRow(rows, []any{&line}, func() error { b.WriteString(line + "\n"); return nil }); err != nil {
			return "", err
		}
		b.WriteString("```\n\n")
	}
	return b.String(), nil
}
