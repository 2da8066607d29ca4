package process_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// reserveOnce sends one reservation request to a reserve process and returns
// the status and the error code ("" for a success).
func reserveOnce(t *testing.T, p *process, user string) (int, string) {
	t.Helper()
	token, err := admission.Mint([]byte(adminKey), sku, user, time.Minute, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"item_id": sku, "user_id": user, "quantity": 1, "idempotency_key": "k-" + user})
	req, _ := http.NewRequest(http.MethodPost, p.url()+"/api/v1/flash-sale/reserve", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	defer resp.Body.Close()
	var e struct{ Code string }
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Code
}

// Redis restarts from an older snapshot under two running reserve processes:
// each refuses (503 CLOSED) from its first call on the restarted server, none
// sells the snapshot's stock, and both sell again once the stock is rebuilt.
func TestReserveProcessesRefuseAStaleRedis(t *testing.T) {
	r := testharness.RedisT(t)
	c := newCampaignOn(t, r.Addr())
	a, b := c.startReserve("reserve-1"), c.startReserve("reserve-2")
	for i, p := range []*process{a, b, a, b} {
		if status, code := reserveOnce(t, p, fmt.Sprintf("early-%d", i)); status != http.StatusCreated {
			t.Fatalf("%s: %d %s", p.name, status, code)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	if err := rdb.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for i, p := range []*process{a, b} {
		if status, code := reserveOnce(t, p, fmt.Sprintf("late-%d", i)); status != http.StatusCreated {
			t.Fatalf("%s: %d %s", p.name, status, code)
		}
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range []*process{a, b} {
		testharness.Eventually(t, 20*time.Second, p.name+" answers CLOSED", func() bool {
			n++
			status, code := reserveOnce(t, p, fmt.Sprintf("during-%d", n))
			if status == http.StatusCreated || status == http.StatusServiceUnavailable && code != "CLOSED" && code != "UNAVAILABLE" {
				t.Fatalf("%s on the stale Redis: %d %s", p.name, status, code)
			}
			return code == "CLOSED"
		})
	}
	if counts := c.counts(); counts.Reserved != 4 || counts.Available != allocation-4 {
		t.Fatalf("the snapshot's stock was touched: %+v", counts)
	}
	if _, err := c.eng.Rebuild(context.Background(), func() string { return stock.StateOpen }); err != nil {
		t.Fatal(err)
	}
	for i, p := range []*process{a, b} {
		if status, code := reserveOnce(t, p, fmt.Sprintf("after-%d", i)); status != http.StatusCreated {
			t.Fatalf("%s after the rebuild: %d %s", p.name, status, code)
		}
	}
	if counts := c.counts(); counts.Reserved != 8 || counts.Available != allocation-8 {
		t.Fatalf("after the rebuild: %+v", counts)
	}
}
