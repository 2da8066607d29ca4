package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzLimit keeps the fuzzer's bodies small while still crossing the limit.
const fuzzLimit = 1024

func limited(body []byte) io.Reader {
	return http.MaxBytesReader(nil, io.NopCloser(bytes.NewReader(body)), fuzzLimit)
}

var decodeSeeds = []string{
	`{"item_id":"itm-ps5-pro","user_id":"u-123","quantity":1,"idempotency_key":"k-1"}`,
	`{"reservation_id":"3.AAAAAAAAAAAAAAAA","payment_token":"pay_1"}`,
	` {"item_id":"a","user_id":"b","quantity":2,"idempotency_key":"c"} ` + "\n",
	`{"item_id":"a","user_id":"b","quantity":1,"idempotency_key":"c","x":1}`,
	`{"item_id":"a","user_id":"b","quantity":"1","idempotency_key":"c"}`,
	`{"item_id":"a","user_id":"b","quantity":1e3,"idempotency_key":"c"}`,
	`{"item_id":"a","user_id":"b","quantity":99999999999999999999,"idempotency_key":"c"}`,
	`{"item_id":"a","user_id":"\u0000","quantity":1,"idempotency_key":"c"}`,
	`{"item_id":"a","user_id":"\ud800","quantity":1,"idempotency_key":"c"}`,
	`{"item_id":"a","item_id":"b","user_id":"b","quantity":1,"idempotency_key":"c"}`,
	`{"item_id":null,"user_id":"b","quantity":1,"idempotency_key":"c"}`,
	`{"item_id":"a"}{"item_id":"b"}`,
	`{"item_id":"a"} x`,
	`{"ITEM_ID":"a","user_id":"b","quantity":1,"idempotency_key":"c"}`,
	`{"reservation_id":"3.AAAAAAAAAAAAAAAA","payment_token":"p","payment_token":"q"}`,
	`{"Reservation_Id":"3.AAAAAAAAAAAAAAAA","payment_token":"p"}`,
	`{"item_id":"a","user_id":"b","quantity":1,"idempotency_\u212aey":"c"}`,
	`{"item\u005fid":"a","item_id":"b","user_id":"b","quantity":1,"idempotency_key":"c"}`,
	`[1,2]`, `null`, `true`, `"x"`, `{`, `}`, ``, "\xff\xfe",
	`{"item_id":"` + strings.Repeat("a", 2*fuzzLimit) + `"}`,
}

// FuzzDecodeReserve: any body is either accepted with every field within bounds,
// or refused with 400 or 413 and a short message; never a panic.
func FuzzDecodeReserve(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, e := decodeReserve(limited(body), 2)
		if e != nil {
			checkRefusal(t, e)
			return
		}
		for _, v := range []string{req.ItemID, req.UserID, req.IdempotencyKey} {
			checkField(t, v, maxIDLen)
		}
		if req.Quantity < 1 || req.Quantity > 2 {
			t.Fatalf("accepted quantity %d", req.Quantity)
		}
		checkKeysExact(t, body, "item_id", "user_id", "quantity", "idempotency_key")
		// What was accepted survives a round trip unchanged.
		js, _ := json.Marshal(req)
		again, e := decodeReserve(bytes.NewReader(js), 2)
		if e != nil || again != req {
			t.Fatalf("round trip of %+v: %+v, %v", req, again, e)
		}
	})
}

// FuzzDecodeCheckout is the same for checkout bodies.
func FuzzDecodeCheckout(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, e := decodeCheckout(limited(body))
		if e != nil {
			checkRefusal(t, e)
			return
		}
		checkField(t, req.ReservationID, maxReservationIDLen)
		checkField(t, req.PaymentToken, maxPaymentTokenLen)
		checkKeysExact(t, body, "reservation_id", "payment_token")
	})
}

// checkKeysExact: an accepted body names each of its fields exactly as
// documented, once.
func checkKeysExact(t *testing.T, body []byte, fields ...string) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("accepted a body that is not an object: %v", err)
	}
	n := 0
	dec := json.NewDecoder(bytes.NewReader(body))
	_, _ = dec.Token() // {
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(fields, k.(string)) {
			t.Fatalf("accepted field %q", k)
		}
		n++
	}
	if n != len(m) {
		t.Fatalf("accepted %d keys naming %d fields: a duplicate", n, len(m))
	}
}

func checkRefusal(t *testing.T, e *apiError) {
	t.Helper()
	ok := e.status == http.StatusBadRequest && e.code == CodeBadRequest ||
		e.status == http.StatusRequestEntityTooLarge && e.code == CodeTooLarge
	if !ok || e.message == "" || len(e.message) > 200 {
		t.Fatalf("refusal %d %s %q", e.status, e.code, e.message)
	}
}

func checkField(t *testing.T, v string, max int) {
	t.Helper()
	if v == "" || utf8.RuneCountInString(v) > max || !utf8.ValidString(v) || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		t.Fatalf("accepted field %q", v)
	}
}

func TestDecodeMessages(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"item_id":"a","user_id":"b","quantity":"1","idempotency_key":"c"}`, "quantity must be an integer, got string"},
		{`{"item_id":1}`, "item_id must be a string, got number"},
		{`{"item_id":"a","price":1}`, `unknown field "price"`},
		{`{"item_id":"a","user_id":"b","idempotency_key":"c"}`, "quantity is required"},
		{`{"item_id":"a","user_id":"b","quantity":5,"idempotency_key":"c"}`, "quantity must be 1..2"},
		{`{"item_id":"a",`, "malformed JSON"},
		{``, "the body is empty"},
		{`[]`, "must be a JSON object"},
		{`{} {}`, "exactly one JSON object"},
		{`{"ITEM_ID":"a","user_id":"b","quantity":1,"idempotency_key":"c"}`, `unknown field "ITEM_ID": field names are case-sensitive, this one is "item_id"`},
		{`{"item_id":"a","user_id":"b","quantity":1,"idempotency_\u212aey":"c"}`, "unknown field \"idempotency_\u212aey\": field names are case-sensitive"},
		{`{"item_id":"a","item_id":"b","user_id":"b","quantity":1,"idempotency_key":"c"}`, `duplicate field "item_id"`},
		{`{"item_id":"a","item\u005fid":"b"}`, `duplicate field "item_id"`},
		{`{"item_id":"a","price":1,"price":2}`, `unknown field "price"`},
	} {
		_, e := decodeReserve(strings.NewReader(tc.body), 2)
		if e == nil || !strings.Contains(e.message, tc.want) {
			t.Errorf("%s: %v, want a message with %q", tc.body, e, tc.want)
		}
	}
}
