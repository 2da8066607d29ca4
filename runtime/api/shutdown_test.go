package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
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
	if !send() {
		t.Fatal("a request sent after the stop was answered: the listener is still open")
	}

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
			if o, err := f.l.GetOrder(ctx, f.e.Config().CampaignID, r.id); err != nil || o.Status != ledger.StatusPending {
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
	// Nothing is held in Redis without its row, and nothing else was written.
	c := f.assertConserved()
	if c.Pending != int64(acked) {
		t.Fatalf("ledger has %d PENDING units, %d were acknowledged", c.Pending, acked)
	}
}

// TestDrainingAnswersCloseTheirConnections: once the stop signal comes, every
// answer closes its kept-alive connection, so buyers in a closed loop move to
// new connections during the drain delay, and none has a request on a reused
// connection cut without an answer when Shutdown closes the idle ones.
func TestDrainingAnswersCloseTheirConnections(t *testing.T) {
	f := newFixture(t, withAllocation(100000), withShards(4), withMaxPerUser(1), withDrainDelay(time.Second))
	// The client takes "Connection: close" out of the header into Close.
	closes := func(user string) (status int, closed bool) {
		body, _ := json.Marshal(reserveBody(user, "k", 1))
		req, err := http.NewRequest(http.MethodPost, f.base+reservePath, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+f.token(user))
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Close
	}
	if status, closed := closes("warm"); status != http.StatusCreated || closed {
		t.Fatalf("a reservation before the stop signal: %d, closes its connection %v; want 201 and kept alive", status, closed)
	}

	stopped := make(chan error, 1)
	go func() { stopped <- f.stop() }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r, err := f.tryCall(http.MethodGet, "/readyz", "", nil)
		if err == nil && r.status == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness not failing 30 s after the stop signal: %v %v", r.status, err)
		}
	}
	if status, closed := closes("draining"); status != http.StatusCreated || !closed {
		t.Fatalf("a reservation while draining: %d, closes its connection %v; want 201 and closed", status, closed)
	}

	// Buyers in a closed loop on kept-alive connections through the rest of
	// the drain and the shutdown: a request on a connection it reused must be
	// answered. Dials refused once the listener is closed are expected.
	var (
		seq          atomic.Int64
		answered     atomic.Int64
		cut, refused atomic.Int64
		done         atomic.Bool
		wg           sync.WaitGroup
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				u := fmt.Sprintf("loop-%d", seq.Add(1))
				var reused bool
				ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
					GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
				})
				body, _ := json.Marshal(reserveBody(u, "k", 1))
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.base+reservePath, bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+f.token(u))
				resp, err := f.client.Do(req)
				switch {
				case err == nil:
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					answered.Add(1)
				case reused:
					cut.Add(1)
					t.Errorf("a request on a reused connection got no answer: %v", err)
				default:
					refused.Add(1)
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Serve after a graceful shutdown: %v", err)
	}
	done.Store(true)
	wg.Wait()
	t.Logf("during the drain and shutdown: %d answered, %d refused dials, %d cut", answered.Load(), refused.Load(), cut.Load())
	if answered.Load() == 0 {
		t.Fatal("no request was answered during the drain: the test proves nothing")
	}
}
