package api

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// TestGracefulShutdown stops the server while reservations are being written (the
// group-commit writer holds each batch for a while) and while buyers keep coming:
// the in-flight ones finish with 201, every 201 has its ledger row (I3), nothing is
// taken from the stock without a row, and Serve returns nil.
func TestGracefulShutdown(t *testing.T) {
	const batchWait = 300 * time.Millisecond
	f := newFixture(t, withAllocation(5000), withShards(4), withMaxPerUser(1),
		withMaterializer(ledger.MaterializerConfig{MaxWait: batchWait, MaxBatch: 512}))

	type result struct {
		id     string
		status int
		at     time.Time
		err    error
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
		seq     atomic.Int64
		stopAt  atomic.Int64
		done    atomic.Bool
	)
	send := func() (refused bool) {
		u := fmt.Sprintf("buyer-%d", seq.Add(1))
		r, err := f.tryCall(http.MethodPost, reservePath, f.token(u), reserveBody(u, "k", 1))
		res := result{status: r.status, at: time.Now(), err: err}
		if err == nil && r.status == http.StatusCreated {
			var b ReservationBody
			r.decode(t, &b)
			res.id = b.ReservationID
		}
		mu.Lock()
		results = append(results, res)
		mu.Unlock()
		return err != nil
	}
	// A burst that is certainly in flight when the stop comes...
	for range 40 {
		wg.Add(1)
		go func() { defer wg.Done(); send() }()
	}
	// ...and buyers that keep arriving through the shutdown.
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				if send() {
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(batchWait / 2)
	stopAt.Store(time.Now().UnixNano())
	if err := f.stop(); err != nil {
		t.Fatalf("Serve after a graceful shutdown: %v", err)
	}
	stopped := time.Now()
	done.Store(true)
	wg.Wait()
	send() // the listener is closed

	ctx := context.Background()
	acked, afterStop, refused := 0, 0, 0
	for _, r := range results {
		switch {
		case r.err != nil:
			refused++ // the listener was closed: never acknowledged
		case r.status == http.StatusCreated:
			acked++
			if r.at.After(time.Unix(0, stopAt.Load())) {
				afterStop++
			}
			if o, err := f.l.GetOrder(ctx, r.id); err != nil || o.Status != ledger.StatusPending {
				t.Errorf("acknowledged %s has no PENDING row: %+v %v", r.id, o, err)
			}
		default:
			t.Errorf("a request answered %d during shutdown", r.status)
		}
	}
	t.Logf("%d acknowledged (%d answered after the stop signal), %d refused; stop took %s",
		acked, afterStop, refused, stopped.Sub(time.Unix(0, stopAt.Load())))
	if afterStop == 0 {
		t.Fatal("no request was in flight at the stop signal: the test proves nothing")
	}
	if refused == 0 {
		t.Fatal("no request arrived after the listener closed: the test proves nothing")
	}
	// Nothing is held in Redis without its row, and nothing else was written.
	c := f.assertConserved()
	if c.Pending != int64(acked) {
		t.Fatalf("ledger has %d PENDING units, %d were acknowledged", c.Pending, acked)
	}
}
