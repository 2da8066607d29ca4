package api

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// streamed hides a body's length, so it is sent chunked and only the server's
// reader limit can stop it.
type streamed struct{ io.Reader }

// TestBadInputChangesNothing: every bad request gets its status and code, and
// neither the stock nor the ledger moves. None of them reaches Redis either: tokens,
// bodies and ownership are all checked before any script runs.
func TestBadInputChangesNothing(t *testing.T) {
	f := newFixture(t, withAllocation(10), withShards(2), withMaxPerUser(2))
	ctx := context.Background()

	// Alice holds a reservation; Bob's is paid for.
	alice := f.reserve("alice", "a-1", 1)
	bob := f.reserve("bob", "b-1", 1)
	if r := f.checkout("bob", bob.ReservationID, "pay-bob"); r.status != http.StatusOK {
		t.Fatalf("checkout: %d %s", r.status, r.body)
	}

	good := f.token("alice")
	body := func(fields map[string]any) map[string]any {
		b := reserveBody("alice", "a-2", 1)
		for k, v := range fields {
			if v == nil {
				delete(b, k)
			} else {
				b[k] = v
			}
		}
		return b
	}
	huge := `{"item_id":"` + testSKU + `","user_id":"alice","quantity":1,"idempotency_key":"` + strings.Repeat("k", 2<<20) + `"}`
	long := strings.Repeat("x", maxIDLen+1)
	expired, err := admission.Mint(testKey, testSKU, "alice", time.Minute, time.Now().Add(-2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	forged, err := admission.Mint([]byte("not-the-admission-key-at-all"), testSKU, "alice", time.Minute, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tampered := []byte(good)
	tampered[10] ^= 1

	// The checkouts whose paying mark Redis reads and refuses.
	markReads := map[string]bool{
		"checkout of another user's reservation":     true,
		"second checkout with another payment token": true,
	}
	for _, tc := range []struct {
		name   string
		method string
		path   string
		token  string
		body   any
		status int
		code   Code
	}{
		{"malformed JSON", "POST", reservePath, good, `{"item_id":"` + testSKU + `",`, 400, CodeBadRequest},
		{"not JSON", "POST", reservePath, good, `item_id=itm-ps5-pro`, 400, CodeBadRequest},
		{"empty body", "POST", reservePath, good, ``, 400, CodeBadRequest},
		{"JSON null", "POST", reservePath, good, `null`, 400, CodeBadRequest},
		{"JSON array", "POST", reservePath, good, `[]`, 400, CodeBadRequest},
		{"two objects", "POST", reservePath, good, `{"item_id":"x"} {}`, 400, CodeBadRequest},
		{"quantity as a string", "POST", reservePath, good, body(map[string]any{"quantity": "1"}), 400, CodeBadRequest},
		{"quantity as a fraction", "POST", reservePath, good, `{"item_id":"` + testSKU + `","user_id":"alice","quantity":1.5,"idempotency_key":"k"}`, 400, CodeBadRequest},
		{"user_id as a number", "POST", reservePath, good, body(map[string]any{"user_id": 42}), 400, CodeBadRequest},
		{"missing quantity", "POST", reservePath, good, body(map[string]any{"quantity": nil}), 400, CodeBadRequest},
		{"missing idempotency_key", "POST", reservePath, good, body(map[string]any{"idempotency_key": nil}), 400, CodeBadRequest},
		{"missing item_id", "POST", reservePath, good, body(map[string]any{"item_id": nil}), 400, CodeBadRequest},
		{"empty user_id", "POST", reservePath, good, body(map[string]any{"user_id": ""}), 400, CodeBadRequest},
		{"unknown field", "POST", reservePath, good, body(map[string]any{"price": 1}), 400, CodeBadRequest},
		{"field name in another case", "POST", reservePath, good, body(map[string]any{"item_id": nil, "ITEM_ID": testSKU}), 400, CodeBadRequest},
		{"field names in mixed case", "POST", reservePath, good,
			`{"Item_Id":"` + testSKU + `","User_Id":"alice","Quantity":1,"Idempotency_Key":"a-2"}`, 400, CodeBadRequest},
		{"field name with a Kelvin sign", "POST", reservePath, good,
			`{"item_id":"` + testSKU + `","user_id":"alice","quantity":1,"idempotency_Key":"a-2"}`, 400, CodeBadRequest},
		{"duplicate field", "POST", reservePath, good,
			`{"item_id":"` + testSKU + `","user_id":"alice","quantity":1,"idempotency_key":"a-2","idempotency_key":"a-3"}`, 400, CodeBadRequest},
		{"duplicate field, escaped", "POST", reservePath, good,
			`{"item_id":"` + testSKU + `","user_id":"alice","user\u005fid":"alice","quantity":1,"idempotency_key":"a-2"}`, 400, CodeBadRequest},
		{"duplicate field in a checkout", "POST", checkoutPath, good,
			`{"reservation_id":"` + alice.ReservationID + `","payment_token":"p","payment_token":"q"}`, 400, CodeBadRequest},
		{"checkout field in another case", "POST", checkoutPath, good,
			`{"Reservation_ID":"` + alice.ReservationID + `","payment_token":"p"}`, 400, CodeBadRequest},
		{"quantity 0", "POST", reservePath, good, body(map[string]any{"quantity": 0}), 400, CodeBadRequest},
		{"quantity above maxPerUser", "POST", reservePath, good, body(map[string]any{"quantity": 3}), 400, CodeBadRequest},
		{"negative quantity", "POST", reservePath, good, body(map[string]any{"quantity": -1}), 400, CodeBadRequest},
		{"idempotency_key too long", "POST", reservePath, good, body(map[string]any{"idempotency_key": long}), 400, CodeBadRequest},
		{"user_id too long", "POST", reservePath, good, body(map[string]any{"user_id": long}), 400, CodeBadRequest},
		{"control character", "POST", reservePath, good, body(map[string]any{"idempotency_key": "a\x00b"}), 400, CodeBadRequest},
		{"unknown item_id", "POST", reservePath, good, body(map[string]any{"item_id": "itm-other"}), 404, CodeNotFound},
		{"no token", "POST", reservePath, "", body(nil), 401, CodeAdmissionInvalid},
		{"forged token", "POST", reservePath, forged, body(nil), 401, CodeAdmissionInvalid},
		{"tampered token", "POST", reservePath, string(tampered), body(nil), 401, CodeAdmissionInvalid},
		{"garbage token", "POST", reservePath, "hello", body(nil), 401, CodeAdmissionInvalid},
		{"expired token", "POST", reservePath, expired, body(nil), 401, CodeAdmissionInvalid},
		{"other-SKU token", "POST", reservePath, f.tokenFor("itm-other", "alice", time.Minute), body(nil), 403, CodeAdmissionInvalid},
		{"other-user token", "POST", reservePath, f.token("mallory"), body(nil), 403, CodeAdmissionInvalid},
		{"2 MiB body", "POST", reservePath, good, huge, 413, CodeTooLarge},
		{"2 MiB body, chunked", "POST", reservePath, good, streamed{strings.NewReader(huge)}, 413, CodeTooLarge},
		{"wrong method on reserve", "GET", reservePath, good, nil, 405, CodeMethodNotAllowed},
		{"wrong method on a reservation", "PUT", cancelPath(alice.ReservationID), good, nil, 405, CodeMethodNotAllowed},
		{"unknown route", "GET", "/api/v1/flash-sale/orders", good, nil, 404, CodeNotFound},
		// Paths the router would redirect to their clean form.
		{"dot-dot after a reservation", "DELETE", cancelPath(alice.ReservationID) + "/..", good, nil, 404, CodeNotFound},
		{"dot after a reservation", "DELETE", cancelPath(alice.ReservationID) + "/.", good, nil, 404, CodeNotFound},
		{"dot-dot onto a reservation", "DELETE", cancelPath("x/../" + alice.ReservationID), good, nil, 404, CodeNotFound},
		{"double slash in reserve", "POST", "/api/v1/flash-sale//reserve", good, body(nil), 404, CodeNotFound},
		{"double slash before a reservation", "DELETE", "/api/v1/flash-sale/reservations//" + alice.ReservationID, good, nil, 404, CodeNotFound},
		{"dot segment in checkout", "POST", "/api/v1/./flash-sale/checkout", good,
			map[string]any{"reservation_id": alice.ReservationID, "payment_token": "p"}, 404, CodeNotFound},
		{"dot-dot in availability", "GET", "/api/v1/flash-sale/items/x/../" + testSKU + "/availability", "", nil, 404, CodeNotFound},
		{"trailing slash on reserve", "POST", reservePath + "/", good, body(nil), 404, CodeNotFound},
		{"checkout of another user's reservation", "POST", checkoutPath, f.token("mallory"),
			map[string]any{"reservation_id": alice.ReservationID, "payment_token": "pay-m"}, 404, CodeNotFound},
		{"cancel of another user's reservation", "DELETE", cancelPath(alice.ReservationID), f.token("mallory"), nil, 404, CodeNotFound},
		{"second checkout with another payment token", "POST", checkoutPath, f.token("bob"),
			map[string]any{"reservation_id": bob.ReservationID, "payment_token": "pay-other"}, 409, CodeConflict},
		{"cancel after commit", "DELETE", cancelPath(bob.ReservationID), f.token("bob"), nil, 409, CodeConflict},
		{"checkout of a malformed id", "POST", checkoutPath, good,
			map[string]any{"reservation_id": "../../etc", "payment_token": "p"}, 404, CodeNotFound},
		{"checkout without payment_token", "POST", checkoutPath, good,
			map[string]any{"reservation_id": alice.ReservationID}, 400, CodeBadRequest},
		{"checkout with an other-SKU token", "POST", checkoutPath, f.tokenFor("itm-other", "alice", time.Minute),
			map[string]any{"reservation_id": alice.ReservationID, "payment_token": "p"}, 403, CodeAdmissionInvalid},
		{"cancel without a token", "DELETE", cancelPath(alice.ReservationID), "", nil, 401, CodeAdmissionInvalid},
		{"availability of another item", "GET", availabilityPath("itm-other"), "", nil, 404, CodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.counts()
			cmds := f.redisCmds.Load()
			var r response
			if s, ok := tc.body.(streamed); ok {
				r = f.callStreamed(tc.method, tc.path, tc.token, s)
			} else {
				r = f.call(tc.method, tc.path, tc.token, tc.body)
			}
			// A checkout reaches Redis once, for the paying mark: the script
			// reads the reservation, finds it is not the buyer's RESERVED one
			// and writes nothing. Every other refusal stops before Redis.
			want := int64(0)
			if markReads[tc.name] {
				want = 1
			}
			if n := f.redisCmds.Load() - cmds; n != want {
				t.Errorf("the request sent %d commands to Redis, want %d", n, want)
			}
			if markReads[tc.name] {
				for i := 0; i < f.e.Config().Shards; i++ {
					if n, err := f.rdb.ZCard(ctx, stock.ShardKeys(f.e.Config().CampaignID, i).Paying()).Result(); err != nil || n != 0 {
						t.Errorf("shard %d's paying index holds %d marks (%v)", i, n, err)
					}
				}
			}
			e := r.errorBody(t)
			if r.status != tc.status || e.Code != tc.code || e.Message == "" {
				t.Fatalf("%d %s, want %d %s", r.status, r.body, tc.status, tc.code)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			switch r.status {
			case 401:
				if r.header.Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
			case 405:
				if r.header.Get("Allow") == "" {
					t.Error("405 without Allow")
				}
			}
			if after := f.counts(); !sameCounts(before, after) {
				t.Fatalf("state changed: %+v -> %+v", before, after)
			}
		})
	}

	// The rows themselves are untouched.
	if o, _ := f.l.GetOrder(ctx, f.e.Config().CampaignID, alice.ReservationID); o.Status != ledger.StatusPending {
		t.Fatalf("alice's reservation is %s", o.Status)
	}
	if o, _ := f.l.GetOrder(ctx, f.e.Config().CampaignID, bob.ReservationID); o.Status != ledger.StatusCommitted || o.PaymentToken != "pay-bob" {
		t.Fatalf("bob's order is %s paid with %q", o.Status, o.PaymentToken)
	}
	c := f.assertConserved()
	if c.Reserved != 1 || c.Sold != 1 {
		t.Fatalf("counts %+v", c)
	}
}

func (f *fixture) callStreamed(method, path, token string, body streamed) response {
	f.t.Helper()
	req, err := http.NewRequest(method, f.base+path, body)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := f.client.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b.Bytes()}
}
