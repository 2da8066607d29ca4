package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// variant is a copy of flashsale_orders with some of what 0002 added.
type variant struct {
	Name  string `json:"name"`
	table string
	ddl   []string
}

// variants: the table with only its primary key, on the request (as 0007
// leaves it, without 0001's live index); with 0002's two partial indexes;
// with those and 0002's counter trigger (the table as it is).
func variants() []variant {
	bare := []string{
		`CREATE TABLE %s (LIKE flashsale_orders INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
		`ALTER TABLE %s ADD PRIMARY KEY (campaign_id, request_key)`,
	}
	idx := append(clone(bare),
		`CREATE INDEX ON %s (campaign_id, shard) INCLUDE (quantity) WHERE status = 'PENDING'`,
		`CREATE INDEX ON %s (campaign_id, user_id) INCLUDE (quantity) WHERE status IN ('PENDING', 'COMMITTED')`)
	full := append(clone(idx),
		`CREATE TRIGGER count_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS new_orders
    FOR EACH STATEMENT EXECUTE FUNCTION flashsale_count_insert()`)
	return []variant{
		{Name: "primary key (the request)", table: "bench_orders_bare", ddl: bare},
		{Name: "+ 0002's partial indexes", table: "bench_orders_idx", ddl: idx},
		{Name: "+ 0002's counter trigger (as shipped)", table: "bench_orders_full", ddl: full},
	}
}

func clone(s []string) []string { return append([]string(nil), s...) }

// The shape of the group-commit writer's insert (runtime/ledger
// sqlInsertPending) without its campaign-row check, which every variant
// would pay alike.
const sqlVariantInsert = `INSERT INTO %s (reservation_id, campaign_id, sku, user_id, shard, quantity, status, epoch, expires_at, request_key)
SELECT t.r, $1, $2, t.u, t.sh, t.q, 'PENDING', 1, t.x, coalesce(nullif(split_part(t.r, '.', 2), ''), '.' || t.r)
FROM unnest($3::text[], $4::text[], $5::integer[], $6::integer[], $7::timestamptz[]) AS t(r, u, sh, q, x)`

// triggerResult is one variant's insert cost and size.
type triggerResult struct {
	Name      string   `json:"name"`
	Rows      int64    `json:"rows"`
	StmtMs    float64  `json:"statement_ms"`    // median, one batch in autocommit
	PGCPUus   float64  `json:"pg_cpu_us_row"`   // PostgreSQL CPU per row
	Bytes     float64  `json:"bytes_per_order"` // table + indexes
	Sizes     relSizes `json:"sizes"`
	stmtTimes []time.Duration
}

// triggerCost inserts the same batches into each variant in turn, reps
// times, stmts statements of batch rows each time, and reports each
// variant's statement time, PostgreSQL CPU per row and size.
func triggerCost(ctx context.Context, l *ledger.Ledger, pgPID, shards, reps, stmts, batch int) ([]triggerResult, error) {
	vs := variants()
	out := make([]triggerResult, len(vs))
	var cpu = make([]time.Duration, len(vs))
	for i, v := range vs {
		for _, d := range v.ddl {
			if _, err := l.Pool().Exec(ctx, fmt.Sprintf(d, v.table)); err != nil {
				return nil, fmt.Errorf("%s: %w", v.table, err)
			}
		}
		out[i].Name = v.Name
	}
	campaign := campaignUID()
	expires := time.Now().Add(time.Hour)
	ids, users := make([]string, batch), make([]string, batch)
	shs, qs, xs := make([]int32, batch), make([]int32, batch), make([]time.Time, batch)
	user := 0
	for range reps {
		for range stmts {
			for k := range batch {
				u := "t" + strconv.Itoa(user)
				user++
				sh := stock.HomeShard(u, shards)
				ids[k], users[k], shs[k], qs[k], xs[k] = stock.FormatID(sh, stock.ReservationKey(idSecret, campaign, u, "r")), u, int32(sh), 1, expires
			}
			// Every variant gets the same rows, in turn; PostgreSQL's CPU is
			// read around each statement, so the others' share of the
			// machine moves all three alike.
			for i, v := range vs {
				c0 := cpustat.TreeWithExited(pgPID)
				t0 := time.Now()
				if _, err := l.Pool().Exec(ctx, fmt.Sprintf(sqlVariantInsert, pgx.Identifier{v.table}.Sanitize()), campaign, "sku", ids, users, shs, qs, xs); err != nil {
					return nil, fmt.Errorf("insert into %s: %w", v.table, err)
				}
				out[i].stmtTimes = append(out[i].stmtTimes, time.Since(t0))
				cpu[i] += cpustat.TreeWithExited(pgPID) - c0
				out[i].Rows += int64(batch)
			}
		}
	}
	for i, v := range vs {
		out[i].StmtMs = median(out[i].stmtTimes)
		out[i].PGCPUus = float64(cpu[i].Microseconds()) / float64(out[i].Rows)
		if _, err := l.Pool().Exec(ctx, "VACUUM ANALYZE "+v.table); err != nil {
			return nil, err
		}
		s, err := sizesOf(ctx, l, v.table)
		if err != nil {
			return nil, err
		}
		out[i].Sizes, out[i].Bytes = s, s.perRow(s.Total)
	}
	for _, v := range vs {
		if _, err := l.Pool().Exec(ctx, "DROP TABLE "+v.table); err != nil {
			return nil, err
		}
	}
	_, err := l.Pool().Exec(ctx, "DELETE FROM flashsale_shard_counts WHERE campaign_id = $1", campaign)
	return out, err
}
