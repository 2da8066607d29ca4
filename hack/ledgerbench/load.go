package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

var idSecret = []byte("ledger-benchmark-id-secret-32byt")

var orderCols = []string{"reservation_id", "campaign_id", "sku", "user_id", "shard", "quantity", "status", "epoch", "expires_at", "payment_token", "request_key"}

// copyChunk is the rows of one COPY statement (one transaction).
const copyChunk = 1_000_000

// campaignUID is a campaign id of production's shape: the FlashSale's UID (36
// characters), which leads every index of the orders table, so a shorter id
// would make the indexes smaller than production's.
func campaignUID() string { return string(uuid.NewUUID()) }

// skuOf is the SKU of a campaign's orders: 12 characters, a SKU's usual size.
func skuOf(campaign string) string { return "sku-" + campaign[:min(8, len(campaign))] }

// newCampaign records a campaign of n units in the ledger.
func newCampaign(ctx context.Context, l *ledger.Ledger, id, name string, shards int, n int64) error {
	_, _, err := l.EnsureCampaign(ctx, ledger.Campaign{ID: id, Namespace: "bench", Name: name, SKU: skuOf(id), Allocation: n, Shards: shards})
	return err
}

// orderRow is one order of buyer i of a campaign, on the buyer's home shard,
// with the reservation id and request key the reserve path derives.
func orderRow(campaign string, shards int, user string, status ledger.Status, expires time.Time) []any {
	shard := stock.HomeShard(user, shards)
	key := stock.ReservationKey(idSecret, campaign, user, "r")
	var token any
	if status == ledger.StatusCommitted {
		token = "pay-" + user
	}
	return []any{stock.FormatID(shard, key), campaign, skuOf(campaign), user, int32(shard), int32(1), string(status), int64(1), expires, token, key}
}

// oldStatus is the end state of order i of a completed sale: 80% sold, 15%
// expired and swept, 4% cancelled by the buyer, 1% abandoned; none pending.
func oldStatus(i int64) ledger.Status {
	switch r := i % 100; {
	case r < 80:
		return ledger.StatusCommitted
	case r < 95:
		return ledger.StatusCancelledBySweeper
	case r < 99:
		return ledger.StatusCancelledByUser
	default:
		return ledger.StatusAbandoned
	}
}

// copyOrders writes orders [from, to) of a campaign with COPY, copyChunk rows
// per statement. The counters' statement-level insert trigger fires on COPY
// as on INSERT; verifyCounters checks that it did.
func copyOrders(ctx context.Context, l *ledger.Ledger, campaign string, shards int, from, to int64, prefix string, status func(int64) ledger.Status, expires time.Time) error {
	for start := from; start < to; start += copyChunk {
		end := min(to, start+copyChunk)
		i := start
		src := pgx.CopyFromFunc(func() ([]any, error) {
			if i >= end {
				return nil, nil
			}
			row := orderRow(campaign, shards, prefix+strconv.FormatInt(i, 10), status(i), expires)
			i++
			return row, nil
		})
		if _, err := l.Pool().CopyFrom(ctx, pgx.Identifier{"flashsale_orders"}, orderCols, src); err != nil {
			return fmt.Errorf("copy orders of %s: %w", campaign, err)
		}
	}
	return nil
}

// verifyCounters compares every campaign's per-shard counters with the sums
// of its orders (a full scan, run once after the load). It returns the
// (campaign, shard) pairs compared.
func verifyCounters(ctx context.Context, l *ledger.Ledger) (int64, error) {
	var pairs, bad int64
	err := l.Pool().QueryRow(ctx, `WITH o AS (
    SELECT campaign_id, shard,
           coalesce(sum(quantity) FILTER (WHERE status = 'PENDING'), 0) AS p,
           coalesce(sum(quantity) FILTER (WHERE status = 'COMMITTED'), 0) AS k
    FROM flashsale_orders GROUP BY campaign_id, shard),
c AS (
    SELECT campaign_id, shard, sum(pending) AS p, sum(committed) AS k
    FROM flashsale_shard_counts GROUP BY campaign_id, shard)
SELECT count(*), count(*) FILTER (WHERE coalesce(o.p, 0) <> coalesce(c.p, 0) OR coalesce(o.k, 0) <> coalesce(c.k, 0))
FROM o FULL JOIN c USING (campaign_id, shard)`).Scan(&pairs, &bad)
	if err != nil {
		return 0, fmt.Errorf("verify counters: %w", err)
	}
	if bad > 0 {
		return pairs, fmt.Errorf("verify counters: %d of %d (campaign, shard) counters disagree with the orders", bad, pairs)
	}
	return pairs, nil
}

// relSizes is the on-disk size of a table and of each of its indexes.
type relSizes struct {
	Rows    int64            `json:"rows"`
	Table   int64            `json:"table_bytes"` // heap, TOAST, free space and visibility maps
	Indexes map[string]int64 `json:"index_bytes"`
	Total   int64            `json:"total_bytes"`
}

func (s relSizes) perRow(b int64) float64 {
	if s.Rows == 0 {
		return 0
	}
	return float64(b) / float64(s.Rows)
}

func sizesOf(ctx context.Context, l *ledger.Ledger, table string) (relSizes, error) {
	s := relSizes{Indexes: map[string]int64{}}
	q := `SELECT pg_table_size($1::regclass), pg_total_relation_size($1::regclass), (SELECT count(*) FROM ` + pgx.Identifier{table}.Sanitize() + `)`
	if err := l.Pool().QueryRow(ctx, q, table).Scan(&s.Table, &s.Total, &s.Rows); err != nil {
		return s, fmt.Errorf("size of %s: %w", table, err)
	}
	rows, err := l.Pool().Query(ctx, `SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index WHERE indrelid = $1::regclass`, table)
	if err != nil {
		return s, err
	}
	var name string
	var size int64
	_, err = pgx.ForEachRow(rows, []any{&name, &size}, func() error {
		s.Indexes[name] = size
		return nil
	})
	return s, err
}
