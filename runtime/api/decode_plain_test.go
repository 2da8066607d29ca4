package api

import (
	"bytes"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/internal/plainjson"
)

// What the plain form takes, the general decoder takes too, into the same
// wire values: the plain form changes no answer, only its cost.
func FuzzPlainFormAgreesWithTheGeneralDecoder(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var plainR, generalR reserveWire
		if plainjson.Object(raw, plainR.plainMember) {
			if e := decodeGeneral(raw, &generalR); e != nil {
				t.Fatalf("plain form took reserve body %q, the general decoder refuses it: %s", raw, e.message)
			}
			if !reflect.DeepEqual(plainR, generalR) {
				t.Fatalf("reserve body %q: plain form %s, general decoder %s", raw, wireText(plainR), wireText(generalR))
			}
		}
		var plainC, generalC checkoutWire
		if plainjson.Object(raw, plainC.plainMember) {
			if e := decodeGeneral(raw, &generalC); e != nil {
				t.Fatalf("plain form took checkout body %q, the general decoder refuses it: %s", raw, e.message)
			}
			if !reflect.DeepEqual(plainC, generalC) {
				t.Fatalf("checkout body %q: plain form %+v, general decoder %+v", raw, plainC, generalC)
			}
		}
	})
}

func wireText(w reserveWire) string {
	s := func(p *string) string {
		if p == nil {
			return "<nil>"
		}
		return strconv.Quote(*p)
	}
	q := "<nil>"
	if w.Quantity != nil {
		q = strconv.Itoa(*w.Quantity)
	}
	return fmt.Sprintf("{item_id %s, user_id %s, quantity %s, idempotency_key %s}", s(w.ItemID), s(w.UserID), q, s(w.IdempotencyKey))
}

// The bodies clients send take the plain form: decoding one allocates its
// strings (13 allocations with the test's reader, against 76 for the general
// decoder alone), and a body the plain form refuses still gets the general
// decoder's answer.
func TestPlainBodiesSkipTheGeneralDecoder(t *testing.T) {
	body := []byte(`{"item_id":"itm-ps5-pro","user_id":"u-123","quantity":1,"idempotency_key":"k-1"}`)
	var w reserveWire
	if !plainjson.Object(body, w.plainMember) {
		t.Fatalf("the plain form refuses %s", body)
	}
	allocs := testing.AllocsPerRun(200, func() {
		if _, e := decodeReserve(limited(body), 2); e != nil {
			t.Fatal(e.message)
		}
	})
	general := testing.AllocsPerRun(200, func() {
		var w reserveWire
		if e := decodeGeneral(body, &w); e != nil {
			t.Fatal(e.message)
		}
	})
	if allocs*3 > general {
		t.Errorf("decodeReserve allocates %.0f times per body, the general decoder alone %.0f: the plain form is not taken", allocs, general)
	}
	for body, want := range map[string]string{
		`{"item_id":"a","item_id":"b","user_id":"b","quantity":1,"idempotency_key":"c"}`: `duplicate field "item_id"`,
		`{"item_id":"a","user_id":"b","quantity":1,"idempotency_key":"c","x":1}`:         `unknown field "x"`,
		`{"item_id":"a","user_id":"b","quantity":"1","idempotency_key":"c"}`:             "quantity must be an integer",
		`{"item_id":null,"user_id":"b","quantity":1,"idempotency_key":"c"}`:              "item_id is required",
		`{"item_id":"a\u0000","user_id":"b","quantity":1,"idempotency_key":"c"}`:         "item_id must be valid UTF-8 without control characters",
	} {
		_, e := decodeReserve(limited([]byte(body)), 2)
		if e == nil || !strings.Contains(e.message, want) {
			t.Errorf("%s: got %v, want an error with %q", body, e, want)
		}
	}
}

// BenchmarkDecodeReserve: a client's body through decodeReserve (the plain
// form) and through the general decoder alone.
func BenchmarkDecodeReserve(b *testing.B) {
	body := []byte(`{"item_id":"itm-ps5-pro","user_id":"u-123","quantity":1,"idempotency_key":"k-1"}`)
	b.Run("decodeReserve", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, e := decodeReserve(bytes.NewReader(body), 2); e != nil {
				b.Fatal(e.message)
			}
		}
	})
	b.Run("general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var w reserveWire
			if e := decodeGeneral(body, &w); e != nil {
				b.Fatal(e.message)
			}
		}
	})
}
