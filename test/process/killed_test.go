package process_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/failpoint"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A reserve process SIGKILLed at each named step of a reservation (it kills
// itself there: FLASHSALE_FAILPOINT) leaves nothing a sweep does not settle:
// once the sale quiesces every unit is back or sold (I1, I2, I6), the buyer's
// quota and pointers are gone, the request has at most one ledger row and
// holds nothing (I4, I5). A retry of the same request on a live process is
// placed when nothing of it reached Redis for good (the claim was reaped),
// and is EXPIRED once its reservation was made and released; the buyer's
// next request is placed (the quota was given back exactly).
func TestReserveKilledAtEachStep(t *testing.T) {
	for _, step := range failpoint.Steps {
		t.Run(step, func(t *testing.T) { testKilledAt(t, step) })
	}
}

// stealSteps are the steps reached only when the home shard is sold out.
var stealSteps = []string{failpoint.ReserveAfterHomeClaim, failpoint.ReserveAfterSteal, failpoint.ReserveAfterConfirm}

func testKilledAt(t *testing.T, step string) {
	c := newCampaign(t)
	ctx := context.Background()
	buyer := homedOn("buyer", 0)
	if slices.Contains(stealSteps, step) {
		c.sellOut(0)
	}
	victim := c.start("reserve-killed", c.env(failpoint.Env+"="+step), "reserve")
	good := c.start("reserve-live", c.env(), "reserve")
	// Two processes start at once: each gets twice a single start's time.
	victim.waitReady(time.Minute)
	good.waitReady(time.Minute)

	if status, code, err := reserveKey(victim.url(), buyer, "r"); err == nil {
		t.Fatalf("the process to be killed at %s answered %d %s", step, status, code)
	}
	select {
	case <-victim.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the process was not killed at %s", step)
	}
	if ws, ok := victim.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the process ended with %v, want SIGKILL at %s", victim.result, step)
	}

	sw, rdb := c.sweeperEngine()
	st := stock.New(rdb, c.id, sw.Config().Shards)
	key := stock.ReservationKey(sw.Config().IDSecret, c.id, buyer, "r")
	home := st.Keys(0)
	testharness.Eventually(t, time.Minute, "the sale to quiesce", func() bool {
		if _, err := sw.Sweep(ctx); err != nil {
			return false
		}
		n, err := sw.Counts(ctx)
		if err != nil || n.Reserved != 0 || n.Pending != 0 {
			return false
		}
		for i := range shards {
			if z, err := rdb.ZCard(ctx, st.Keys(i).Claims()).Result(); err != nil || z != 0 {
				return false
			}
		}
		return true
	})
	c.assertSettled()
	left, err := rdb.HMGet(ctx, home.Users(), buyer, "p:"+key).Result()
	if err != nil || left[0] != nil || left[1] != nil {
		t.Fatalf("the buyer's quota and pointer after the sweep: %v %v, want none", left, err)
	}
	if rows, live := c.requestRows(buyer, key); rows > 1 || live != 0 {
		t.Fatalf("I4/I5: the request has %d ledger rows, %d units live after the sweep", rows, live)
	}

	want, wantCode := http.StatusGone, "EXPIRED"
	if step == failpoint.ReserveAfterHomeClaim {
		want, wantCode = http.StatusCreated, ""
	}
	if status, code, err := reserveKey(good.url(), buyer, "r"); err != nil || status != want || code != wantCode {
		t.Fatalf("retry of the request: %d %s %v, want %d %s", status, code, err, want, wantCode)
	}
	if step != failpoint.ReserveAfterHomeClaim {
		if status, code, err := reserveKey(good.url(), buyer, "next"); err != nil || status != http.StatusCreated {
			t.Fatalf("the buyer's next request: %d %s %v, want 201", status, code, err)
		}
	}
	var units int64
	if err := c.l.Pool().QueryRow(ctx, `SELECT coalesce(sum(quantity),0) FROM flashsale_orders
		WHERE campaign_id=$1 AND user_id=$2 AND status IN ('PENDING','COMMITTED')`, c.id, buyer).Scan(&units); err != nil {
		t.Fatal(err)
	}
	if units != 1 {
		t.Fatalf("I5: the buyer holds %d units, want the 1 placed after the sweep", units)
	}
}

// homedOn is a user whose home shard is shard.
func homedOn(prefix string, shard int) string {
	for i := 0; ; i++ {
		if u := fmt.Sprintf("%s-%d", prefix, i); stock.HomeShard(u, shards) == shard {
			return u
		}
	}
}

// sellOut reserves every unit of shard through the test's engine, for buyers
// homed there; the reservations expire with the TTL and go back.
func (c *campaign) sellOut(shard int) {
	c.t.Helper()
	ctx := context.Background()
	for i := 0; c.counts().Shards[shard].Available > 0; i++ {
		for j := 0; j < 20 && c.counts().Shards[shard].Available > 0; j++ {
			u := homedOn(fmt.Sprintf("filler-%d-%d", i, j), shard)
			if _, err := c.eng.Reserve(ctx, u, "r", 1); err != nil {
				c.t.Fatal(err)
			}
		}
	}
}

// sweeperEngine is an engine on the campaign that sweeps as the sweeper
// process does, with a claim slack of a second, so that a claim whose
// process died is reaped within seconds of its reservation's expiry; and the
// Redis client under it.
func (c *campaign) sweeperEngine() (*engine.Engine, *redis.Client) {
	c.t.Helper()
	cfg := c.eng.Config()
	cfg.ClaimSlack = time.Second
	rdb := redis.NewClient(&redis.Options{Addr: c.redis, MaxRetries: -1})
	c.t.Cleanup(func() { _ = rdb.Close() })
	e, err := engine.New(cfg, rdb, c.l, ledger.MaterializerConfig{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(e.Close)
	return e, rdb
}

// requestRows counts the ledger rows of the request with this key, and the
// units of them PENDING or COMMITTED.
func (c *campaign) requestRows(user, key string) (rows, live int64) {
	c.t.Helper()
	if err := c.l.Pool().QueryRow(context.Background(),
		`SELECT count(*), coalesce(sum(quantity) FILTER (WHERE status IN ('PENDING','COMMITTED')),0)
		 FROM flashsale_orders WHERE campaign_id=$1 AND user_id=$2 AND split_part(reservation_id, '.', 2) = $3`,
		c.id, user, key).Scan(&rows, &live); err != nil {
		c.t.Fatal(err)
	}
	return rows, live
}

// reserveKey sends one reservation request with the idempotency key key;
// err is the transport's (the process died before it answered).
func reserveKey(url, user, key string) (int, string, error) {
	token, err := admission.Mint([]byte(adminKey), sku, user, time.Minute, time.Now())
	if err != nil {
		return 0, "", err
	}
	body, _ := json.Marshal(map[string]any{"item_id": sku, "user_id": user, "quantity": 1, "idempotency_key": key})
	req, _ := http.NewRequest(http.MethodPost, url+"/api/v1/flash-sale/reserve", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var e struct{ Code string }
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Code, nil
}
