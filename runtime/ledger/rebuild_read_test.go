package ledger

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"
)

// The rebuild's reads come from one snapshot: a checkout committed while the
// orders stream is seen by none of the figures, so the committed units (from
// the counters, read first) and the pending ones (streamed later) still add
// up. Read at two moments, the checked-out unit would be in neither, and the
// rebuilt stock one too high: an oversell.
func TestReadRebuildIsOneSnapshot(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	var orders []Order
	for i := range 6 {
		orders = append(orders, insertOrder(t, l, pendingOrder(c, fmt.Sprintf("u%d", i), i%2, time.Hour), time.Hour))
	}
	snap, err := l.BeginRebuild(ctx, c.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var streamed []Order
	holders := map[string]int64{}
	batches := 0
	counts, err := l.ReadRebuild(ctx, c.ID, c.Shards, RebuildReader{
		Batch: 2,
		Pending: func(ctx context.Context, os []Order) error {
			if batches++; batches == 1 {
				// Every order, streamed or not yet, is paid for meanwhile,
				// but the last, which its buyer cancels.
				for _, o := range orders[:5] {
					if out, _, err := l.Checkout(ctx, c.ID, o.ReservationID, o.UserID, "pay"); err != nil || out != CheckoutCommitted {
						return fmt.Errorf("checkout %s: %v %v", o.ReservationID, out, err)
					}
				}
				if out, _, err := l.CancelByUser(ctx, c.ID, orders[5].ReservationID, orders[5].UserID); err != nil || out != CancelCancelled {
					return fmt.Errorf("cancel %s: %v %v", orders[5].ReservationID, out, err)
				}
			}
			streamed = append(streamed, os...)
			return nil
		},
		Holders: func(_ context.Context, hs []Holder) error {
			for _, h := range hs {
				holders[h.UserID] += h.Units
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if batches != 4 || len(streamed) != 6 {
		t.Errorf("%d orders in %d batches, want 6 in 4 (two per shard)", len(streamed), batches)
	}
	// Each streamed order carries what a rebuild restores, as written.
	for _, o := range streamed {
		i := slices.IndexFunc(orders, func(w Order) bool { return w.ReservationID == o.ReservationID })
		if i < 0 {
			t.Fatalf("streamed %s, never written", o.ReservationID)
		}
		w := orders[i]
		if o.UserID != w.UserID || o.Shard != w.Shard || o.Quantity != w.Quantity || o.Epoch != w.Epoch ||
			!o.ExpiresAt.Equal(w.ExpiresAt) || o.CreatedAt.IsZero() || o.Status != StatusPending || o.CampaignID != c.ID {
			t.Errorf("streamed %+v, written %+v", o, w)
		}
	}
	if want := []ShardCounts{{Pending: 3}, {Pending: 3}}; !slices.Equal(counts, want) {
		t.Errorf("counts %v, want %v: the reads saw the checkouts halfway", counts, want)
	}
	// The buyers, read before the cancel, are read as they were.
	if len(holders) != 6 || holders[orders[5].UserID] != 1 {
		t.Errorf("holders %v: the buyers were read after the cancel", holders)
	}
	// The next rebuild sees them sold and cancelled.
	if _, _, counts := readRebuild(t, l, snap.Campaign, 10); !slices.Equal(counts, []ShardCounts{{Committed: 3}, {Committed: 2}}) {
		t.Errorf("counts after the checkouts %v", counts)
	}
}

// Counters that contradict the orders stop the rebuild: stock is never
// computed from a ledger that disagrees with itself.
func TestReadRebuildRefusesDriftedCounters(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 2)
	insertOrder(t, l, pendingOrder(c, "u", 1, time.Hour), time.Hour)
	if _, err := l.Pool().Exec(ctx, `UPDATE flashsale_shard_counts SET pending = pending + 1 WHERE campaign_id = $1 AND shard = 1`, c.ID); err != nil {
		t.Fatal(err)
	}
	_, err := l.ReadRebuild(ctx, c.ID, c.Shards, RebuildReader{})
	if !errors.Is(err, ErrCountsDrift) {
		t.Fatalf("drifted counters: %v", err)
	}
	if _, err := l.ReadRebuild(ctx, c.ID, 0, RebuildReader{}); err == nil {
		t.Error("a read of 0 shards was answered")
	}
}

// A reader's error stops the stream and is returned.
func TestReadRebuildStopsOnTheReadersError(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 100, 1)
	for i := range 5 {
		insertOrder(t, l, pendingOrder(c, fmt.Sprintf("u%d", i), 0, time.Hour), time.Hour)
	}
	boom := errors.New("redis is gone")
	calls := 0
	_, err := l.ReadRebuild(ctx, c.ID, c.Shards, RebuildReader{
		Batch:   1,
		Pending: func(context.Context, []Order) error { calls++; return boom },
	})
	if !errors.Is(err, boom) || calls != 1 {
		t.Fatalf("err %v after %d calls", err, calls)
	}
	calls = 0
	_, err = l.ReadRebuild(ctx, c.ID, c.Shards, RebuildReader{
		Batch:   2,
		Holders: func(context.Context, []Holder) error { calls++; return boom },
	})
	if !errors.Is(err, boom) || calls != 1 {
		t.Fatalf("holders: err %v after %d calls", err, calls)
	}
}

// A database or role may set statement and idle-in-transaction timeouts that
// a rebuild's read outlives: it streams its orders while Redis is written,
// its snapshot's transaction idle meanwhile. Cut, the read would fail each
// retry and the sale stay closed; it lifts them for its own transactions.
// Here the server has sent every order before the first batch is written
// (a few small rows), so the session waits idle in its transaction while
// the batches take longer than the limit.
func TestReadRebuildOutlivesTheServersTimeouts(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	l := openLedger(t, newDSN(t, testPG)+"&idle_in_transaction_session_timeout=200&statement_timeout=200")
	c := newCampaign(t, l, 100, 2)
	for i := range 4 {
		insertOrder(t, l, pendingOrder(c, fmt.Sprintf("u%d", i), i%2, time.Hour), time.Hour)
	}
	if _, err := l.BeginRebuild(ctx, c.ID, 0); err != nil {
		t.Fatal(err)
	}
	streamed := 0
	counts, err := l.ReadRebuild(ctx, c.ID, c.Shards, RebuildReader{
		Batch: 1, Readers: 1,
		Pending: func(context.Context, []Order) error {
			streamed++
			time.Sleep(300 * time.Millisecond) // a slow Redis write
			return nil
		},
	})
	if err != nil {
		t.Fatalf("read under the server's timeouts: %v", err)
	}
	if streamed != 4 || counts[0].Pending+counts[1].Pending != 4 {
		t.Fatalf("streamed %d orders, counts %+v", streamed, counts)
	}
}

// The rebuild's transactions have the server probe their session and lift
// its time limits (see sqlUntimedTx); the ledger's connections probe the
// server (Open's dialer).
func TestRebuildReadSessionIsProbedBothWays(t *testing.T) {
	t.Parallel()
	l := openLedger(t, newDSN(t, testPG)+"&statement_timeout=200")
	ctx := testCtx(t)
	conn, err := l.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tcp, ok := conn.Conn().PgConn().Conn().(*net.TCPConn)
	if !ok {
		t.Fatalf("the ledger's connection is a %T, not TCP", conn.Conn().PgConn().Conn())
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for opt, want := range map[int]int{syscall.TCP_KEEPIDLE: 10, syscall.TCP_KEEPINTVL: 5, syscall.TCP_KEEPCNT: 3} {
		var got int
		var gerr error
		if err := raw.Control(func(fd uintptr) { got, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, opt) }); err != nil || gerr != nil {
			t.Fatal(err, gerr)
		}
		if got != want {
			t.Errorf("TCP option %d is %d, want %d", opt, got, want)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sqlUntimedTx); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"statement_timeout": "0", "idle_in_transaction_session_timeout": "0",
		"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3", "tcp_user_timeout": "20000"} {
		var got string
		if err := tx.QueryRow(ctx, `SELECT setting FROM pg_settings WHERE name = $1`, name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s is %s in the rebuild's transaction, want %s", name, got, want)
		}
	}
}
