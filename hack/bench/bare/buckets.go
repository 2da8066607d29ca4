package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// The PostgreSQL bucket design: the SKU's stock split over N rows so that
// buyers contend on N row locks instead of one. The benchmark creates and
// seeds the tables (BucketSchema); the handler only reserves.
const (
	// BucketSchema is created by the benchmark before the handler starts.
	BucketSchema = `CREATE TABLE bucket_stock (
  sku text NOT NULL, bucket int NOT NULL, available bigint NOT NULL,
  PRIMARY KEY (sku, bucket));
CREATE TABLE bucket_orders (
  token text PRIMARY KEY, sku text NOT NULL, user_id text NOT NULL,
  bucket int NOT NULL, qty int NOT NULL, status text NOT NULL DEFAULT 'PENDING',
  expires_at timestamptz NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`
	sqlBucketTake = `UPDATE bucket_stock SET available = available - $3
WHERE sku = $1 AND bucket = $2 AND available >= $3`
	// The order row's primary key is the derived reservation key: a retried
	// request conflicts and is answered as a replay (its transaction rolls
	// back, so the unit it took goes back).
	sqlBucketOrder = `INSERT INTO bucket_orders (token, sku, user_id, bucket, qty, expires_at)
VALUES ($1, $2, $3, $4, $5, now() + $6::interval) ON CONFLICT (token) DO NOTHING RETURNING expires_at`
	sqlBucketReplay = `SELECT bucket, expires_at FROM bucket_orders WHERE token = $1`
	bucketTxTimeout = 10 * time.Second
)

type bucketOptions struct {
	buckets, probes, conns int
}

func (o *bucketOptions) addFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.buckets, "buckets", 64, "pg-buckets: bucket rows per SKU")
	fs.IntVar(&o.probes, "probes", 2, "pg-buckets: other buckets tried when the first is empty")
	fs.IntVar(&o.conns, "pg-conns", 64, "pg-buckets: PostgreSQL connections of the pool")
}

type bucketHandler struct {
	o        bucketOptions
	pool     *pgxpool.Pool
	sku      string
	campaign string
	keys     *stock.Keyer
	ttl      string
}

func newBucketHandler(ctx context.Context, o bucketOptions, dsn, sku, campaign string, secret []byte, ttl time.Duration) (*bucketHandler, error) {
	if o.buckets < 1 || o.probes < 0 || o.conns < 1 {
		return nil, errors.New("--buckets and --pg-conns must be at least 1, --probes at least 0")
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pc.MaxConns, pc.MinConns = int32(o.conns), int32(o.conns)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM bucket_stock WHERE sku = $1`, sku).Scan(&n); err != nil || n != o.buckets {
		pool.Close()
		return nil, fmt.Errorf("bucket_stock has %d rows for %s, want %d (%v)", n, sku, o.buckets, err)
	}
	return &bucketHandler{o: o, pool: pool, sku: sku, campaign: campaign, keys: stock.NewKeyer(secret),
		ttl: strconv.FormatInt(ttl.Milliseconds(), 10) + " milliseconds"}, nil
}

func (b *bucketHandler) close()                         { b.pool.Close() }
func (b *bucketHandler) ping(ctx context.Context) error { return b.pool.Ping(ctx) }

// pick is a random bucket and up to probes other distinct ones.
func (b *bucketHandler) pick() []int {
	n := b.o.buckets
	out := []int{rand.IntN(n)}
	for len(out) < min(n, 1+b.o.probes) {
		c := rand.IntN(n)
		dup := false
		for _, x := range out {
			dup = dup || x == c
		}
		if !dup {
			out = append(out, c)
		}
	}
	return out
}

var errSoldOut = errors.New("sold out")

func (b *bucketHandler) reserve(w http.ResponseWriter, r *http.Request) {
	in, ok := decode(w, r)
	if !ok {
		return
	}
	key := b.keys.Key(b.campaign, in.UserID, in.IdempotencyKey)
	ctx, cancel := context.WithTimeout(r.Context(), bucketTxTimeout)
	defer cancel()
	var bucket int
	var expiry time.Time
	replay := false
	// One transaction: the decrement and the order row commit together
	// (synchronous_commit on), so a 201 is durable.
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		bucket = -1
		for _, c := range b.pick() {
			tag, err := tx.Exec(ctx, sqlBucketTake, b.sku, c, in.Quantity)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 1 {
				bucket = c
				break
			}
		}
		if bucket < 0 {
			return errSoldOut
		}
		err := tx.QueryRow(ctx, sqlBucketOrder, key, b.sku, in.UserID, bucket, in.Quantity, b.ttl).Scan(&expiry)
		if errors.Is(err, pgx.ErrNoRows) {
			replay = true
			return errReplay
		}
		return err
	})
	switch {
	case err == nil:
		reserved(w, false, strconv.Itoa(bucket)+"."+key, expiry)
	case errors.Is(err, errSoldOut):
		soldOut(w)
	case errors.Is(err, errReplay) && replay:
		if err := b.pool.QueryRow(ctx, sqlBucketReplay, key).Scan(&bucket, &expiry); err != nil {
			writeError(w, http.StatusServiceUnavailable, "UNAVAILABLE", err.Error())
			return
		}
		reserved(w, true, strconv.Itoa(bucket)+"."+key, expiry)
	default:
		writeError(w, http.StatusServiceUnavailable, "UNAVAILABLE", err.Error())
	}
}

// errReplay rolls back the transaction of a request that was reserved before.
var errReplay = errors.New("replay")
