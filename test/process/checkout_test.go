package process_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/failpoint"
	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A reserve process SIGKILLed by a checkout between its ledger commit and its
// Redis step (FLASHSALE_FAILPOINT=checkout-after-ledger) leaves the unit
// COMMITTED in the ledger and RESERVED in Redis. The first sweep after the kill
// settles it, though the reservation lives ten minutes: the audit (available +
// reserved from Redis, sold from the ledger) is exact again, not one unit over
// the allocation until the reservation's expiry and grace. The buyer's retried
// checkout on a live process answers as paid.
func TestCheckoutKilledAfterLedger(t *testing.T) {
	c := newCampaignWith(t, sharedRS.Addr(), 10*time.Minute)
	ctx := context.Background()
	buyer := homedOn("payer", 3)
	victim := c.start("reserve-killed", c.env(failpoint.Env+"="+failpoint.CheckoutAfterLedger), "reserve")
	good := c.start("reserve-live", c.env(), "reserve")
	victim.waitReady(time.Minute)
	good.waitReady(time.Minute)

	id, err := reserveID(victim.url(), buyer, "r")
	if err != nil {
		t.Fatal(err)
	}
	if status, err := checkout(victim.url(), buyer, id, "pay-1"); err == nil {
		t.Fatalf("the process to be killed at %s answered the checkout %d", failpoint.CheckoutAfterLedger, status)
	}
	select {
	case <-victim.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the process was not killed at %s", failpoint.CheckoutAfterLedger)
	}
	if ws, ok := victim.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the process ended with %v, want SIGKILL at %s", victim.result, failpoint.CheckoutAfterLedger)
	}
	// The step the kill cut off: sold in the ledger, still reserved in Redis.
	n := c.counts()
	if n.Sold != 1 || n.Reserved != 1 || n.Available+n.Reserved+n.Sold != allocation+1 {
		t.Fatalf("after the kill: available %d, reserved %d, sold %d; want the unit both reserved and sold", n.Available, n.Reserved, n.Sold)
	}

	sw, rdb := c.sweeperEngine()
	st, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n = c.counts()
	if n.Available+n.Reserved+n.Sold != allocation || n.Reserved != 0 || n.Sold != 1 || n.Oversold() != 0 {
		t.Fatalf("one sweep (%+v) after the kill: available %d + reserved %d + sold %d, want %d with nothing reserved",
			st, n.Available, n.Reserved, n.Sold, allocation)
	}
	shard, key, err := stock.ParseID(id, shards)
	if err != nil {
		t.Fatal(err)
	}
	k := stock.New(rdb, c.id, shards).Keys(shard)
	if s, err := rdb.HGet(ctx, k.Res(key), "s").Result(); err != nil || s != "C" {
		t.Fatalf("the reservation's status in Redis: %q %v, want C", s, err)
	}
	if z, err := rdb.ZCard(ctx, k.Paying()).Result(); err != nil || z != 0 {
		t.Fatalf("%d paying marks left after the sweep (%v)", z, err)
	}
	if status, err := checkout(good.url(), buyer, id, "pay-1"); err != nil || status != http.StatusOK {
		t.Fatalf("the retried checkout: %d %v, want 200", status, err)
	}
	if n := c.counts(); n.Available+n.Reserved+n.Sold != allocation || n.Sold != 1 {
		t.Fatalf("after the retried checkout: %+v", n)
	}
}

// reserveID reserves one unit for user with the idempotency key key and
// returns the reservation id of the 201.
func reserveID(url, user, key string) (string, error) {
	token, err := admission.Mint([]byte(adminKey), sku, user, time.Minute, time.Now())
	if err != nil {
		return "", err
	}
	body, _ := json.Marshal(map[string]any{"item_id": sku, "user_id": user, "quantity": 1, "idempotency_key": key})
	req, _ := http.NewRequest(http.MethodPost, url+"/api/v1/flash-sale/reserve", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var r struct {
		ReservationID string `json:"reservation_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusCreated || r.ReservationID == "" {
		return "", &httpError{resp.StatusCode, err}
	}
	return r.ReservationID, nil
}

// checkout pays for reservation id as user; err is the transport's.
func checkout(url, user, id, payment string) (int, error) {
	token, err := admission.Mint([]byte(adminKey), sku, user, time.Minute, time.Now())
	if err != nil {
		return 0, err
	}
	body, _ := json.Marshal(map[string]any{"reservation_id": id, "payment_token": payment})
	req, _ := http.NewRequest(http.MethodPost, url+"/api/v1/flash-sale/checkout", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

type httpError struct {
	status int
	err    error
}

func (e *httpError) Error() string {
	if e.err != nil {
		return http.StatusText(e.status) + ": " + e.err.Error()
	}
	return "answered " + http.StatusText(e.status)
}
