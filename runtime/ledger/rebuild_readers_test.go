package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// holdConns takes n connections of l's pool until release is called.
func holdConns(t *testing.T, l *Ledger, n int) (release func()) {
	t.Helper()
	var held []*pgxpool.Conn
	for range n {
		c, err := l.Pool().Acquire(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			for _, c := range held {
				c.Release()
			}
		})
	}
	t.Cleanup(release)
	return release
}

// A second reader reads from the first one's snapshot even when it starts
// after checkouts and a cancel committed: its shard's orders are read as
// they were when the counters were, so the rebuilt stock stays exact. The
// second reader is held off by a pool the test holds until the changes are
// made; read from a snapshot of its own, it would find its shard's orders
// gone and the counters drifted.
func TestReadRebuildReadersShareOneSnapshot(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dsn := newDSN(t, testPG)
	l, err := Open(ctx, dsn, WithMaxConns(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	// The buyers' changes go through a pool of their own: l's is held.
	buyers := openLedger(t, dsn)
	c := newCampaign(t, l, 100, 2)
	var orders []Order
	for i := range 6 {
		orders = append(orders, insertOrder(t, l, pendingOrder(c, fmt.Sprintf("u%d", i), i%2, time.Hour), time.Hour))
	}
	if _, err := l.BeginRebuild(ctx, c.ID, 0); err != nil {
		t.Fatal(err)
	}
	// The read's own transaction takes the third connection.
	release := holdConns(t, l, 2)
	var (
		mu       sync.Mutex
		streamed []Order
		holders  = map[string]int64{}
		changed  bool
		fromPeer = make(chan struct{}, 16)
	)
	counts, err := l.ReadRebuild(ctx, c.ID, c.Shards, RebuildReader{
		Batch:   1,
		Readers: 2,
		Pending: func(_ context.Context, os []Order) error {
			fromPeer <- struct{}{}
			mu.Lock()
			defer mu.Unlock()
			streamed = append(streamed, os...)
			return nil
		},
		Holders: func(ctx context.Context, hs []Holder) error {
			mu.Lock()
			first := !changed
			changed = true
			for _, h := range hs {
				holders[h.UserID] += h.Units
			}
			mu.Unlock()
			if !first {
				return nil
			}
			// The buyers are the first task, so the read's own transaction
			// is here and the other reader waits for a connection: every
			// order changes, then the connections go back, and this reader
			// waits until the other one has streamed a batch.
			for _, o := range orders[:5] {
				if out, _, err := buyers.Checkout(ctx, c.ID, o.ReservationID, o.UserID, "pay"); err != nil || out != CheckoutCommitted {
					return fmt.Errorf("checkout %s: %v %v", o.ReservationID, out, err)
				}
			}
			if out, _, err := buyers.CancelByUser(ctx, c.ID, orders[5].ReservationID, orders[5].UserID); err != nil || out != CancelCancelled {
				return fmt.Errorf("cancel %s: %v %v", orders[5].ReservationID, out, err)
			}
			release()
			select {
			case <-fromPeer:
				return nil
			case <-time.After(20 * time.Second):
				return errors.New("the second reader streamed no pending order")
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []ShardCounts{{Pending: 3}, {Pending: 3}}; !slices.Equal(counts, want) {
		t.Errorf("counts %v, want %v", counts, want)
	}
	if len(streamed) != 6 || len(holders) != 6 {
		t.Errorf("%d orders and %d buyers streamed, want 6 and 6", len(streamed), len(holders))
	}
}

// Readers that cannot get a connection do not stall the read: the read's
// own transaction reads everything, and readers beyond the pool's size less
// one are not started.
func TestReadRebuildFinishesWithoutSpareConnections(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	for _, conns := range []int32{1, 3} {
		t.Run(fmt.Sprintf("pool of %d", conns), func(t *testing.T) {
			l, err := Open(ctx, newDSN(t, testPG), WithMaxConns(conns))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			c := newCampaign(t, l, 100, 3)
			for i := range 9 {
				insertOrder(t, l, pendingOrder(c, fmt.Sprintf("u%d", i), i%3, time.Hour), time.Hour)
			}
			if _, err := l.BeginRebuild(ctx, c.ID, 0); err != nil {
				t.Fatal(err)
			}
			holdConns(t, l, int(conns)-1)
			var mu sync.Mutex
			n := 0
			counts, err := l.ReadRebuild(ctx, c.ID, c.Shards, RebuildReader{
				Batch: 2, Readers: 4,
				Pending: func(_ context.Context, os []Order) error {
					mu.Lock()
					n += len(os)
					mu.Unlock()
					return nil
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if want := []ShardCounts{{Pending: 3}, {Pending: 3}, {Pending: 3}}; n != 9 || !slices.Equal(counts, want) {
				t.Errorf("%d orders streamed, counts %v", n, counts)
			}
		})
	}
}
