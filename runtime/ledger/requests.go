package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// A request (campaign, user, client request id) has at most one row for the
// life of the sale, whatever its shard and status: flashsale_orders.request_key
// is the request's key, the part of the reservation id after the shard, and is
// unique per campaign (0003_request_key.sql). Redis forgets a request when its
// reservation ends; the ledger does not.

const sqlGetRequestOrder = `SELECT ` + orderColumns + ` FROM flashsale_orders WHERE campaign_id = (SELECT $1::text) AND request_key = $2`

// GetRequestOrder returns the row of the request whose key is requestKey (a
// reservation id without its shard), on any shard, or ErrNotFound.
func (l *Ledger) GetRequestOrder(ctx context.Context, campaignID, requestKey string) (Order, error) {
	o, err := scanOrder(l.pool.QueryRow(ctx, sqlGetRequestOrder, campaignID, requestKey))
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, fmt.Errorf("%w: request %s", ErrNotFound, requestKey)
	}
	if err != nil {
		return Order{}, fmt.Errorf("ledger: get request %s: %w", requestKey, err)
	}
	return o, nil
}

// byRequest orders reservation ids by request key, then id: rows inserted in
// this order take the primary key's locks (the request's) in one order, so
// concurrent batches holding two requests each cannot deadlock.
func byRequest(a, b string) int {
	if c := strings.Compare(requestKey(a), requestKey(b)); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}

// requestKey is a reservation id without its shard.
func requestKey(id string) string {
	_, key, _ := strings.Cut(id, ".")
	return key
}
