package plainjson

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"testing"
)

// members reads raw with Object, each key at most once, into key → value
// (integers in decimal, strings quoted).
func members(raw []byte) (map[string]string, bool) {
	got := map[string]string{}
	ok := Object(raw, func(key []byte, v Value) bool {
		if _, dup := got[string(key)]; dup {
			return false
		}
		if v.IsInt {
			got[string(key)] = strconv.FormatInt(v.Int, 10)
		} else {
			got[string(key)] = strconv.Quote(string(v.Str))
		}
		return true
	})
	return got, ok
}

// reference is what encoding/json makes of raw, in the form of members.
func reference(raw []byte) (map[string]string, error) {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, strconv.ErrSyntax // more after the object
	}
	out := map[string]string{}
	for k, v := range m {
		switch v := v.(type) {
		case string:
			out[k] = strconv.Quote(v)
		case json.Number:
			out[k] = v.String()
			if n, err := v.Int64(); err == nil {
				out[k] = strconv.FormatInt(n, 10) // -0 is 0
			}
		default:
			out[k] = "not a string or a number"
		}
	}
	return out, nil
}

func TestObjectReadsThePlainForm(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want map[string]string
	}{
		{`{}`, map[string]string{}},
		{" \t\r\n{ } \n", map[string]string{}},
		{`{"item_id":"sku-1","user_id":"u1","quantity":1,"idempotency_key":"k"}`,
			map[string]string{"item_id": `"sku-1"`, "user_id": `"u1"`, "quantity": "1", "idempotency_key": `"k"`}},
		{"{ \"a\" : \"\" ,\n\"b\":-0 , \"c\": -12 }", map[string]string{"a": `""`, "b": "0", "c": "-12"}},
		{`{"a":"héllo ✓ 😀","b":999999999999999999}`, map[string]string{"a": `"héllo ✓ 😀"`, "b": "999999999999999999"}},
		{`{"a":"` + "\x7f" + `"}`, map[string]string{"a": `"\x7f"`}},
	} {
		got, ok := members([]byte(tc.raw))
		if !ok || !maps.Equal(got, tc.want) {
			t.Errorf("Object(%q) = %v, %v; want %v, true", tc.raw, got, ok, tc.want)
		}
	}
}

// Everything but the plain form is left to encoding/json, valid JSON or not.
func TestObjectSaysNoToTheRest(t *testing.T) {
	for _, raw := range []string{
		``, ` `, `[]`, `"a"`, `1`, `null`, `{`, `}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,"a":1}`,
		`{"a":1}{}`, `{"a":1} x`, `{"a":1}` + "\x00", "\ufeff{}", `{"a":1 "b":2}`, `{"a"::1}`,
		`{"a":"\n"}`, `{"a":"\u0041"}`, `{"a":"x\"y"}`, `{"\u0061":1}`, `{"a":"` + "\x01" + `"}`,
		`{"a":"` + "\xff" + `"}`, `{"a":"` + "\xed\xa0\x80" + `"}`, `{"` + "\xc3" + `":1}`,
		`{"a":null}`, `{"a":true}`, `{"a":{}}`, `{"a":[]}`, `{"a":1.0}`, `{"a":1e2}`, `{"a":1E2}`,
		`{"a":01}`, `{"a":-}`, `{"a":--1}`, `{"a":+1}`, `{"a":1234567890123456789}`, `{"a":-1234567890123456789}`,
		`{"a":"b","a":"c"}`, `{'a':1}`, `{a:1}`, "{\"a\":1\v}",
	} {
		if got, ok := members([]byte(raw)); ok {
			t.Errorf("Object(%q) took it: %v", raw, got)
		}
	}
}

// What Object takes, encoding/json takes too, with the same values.
func FuzzObjectAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"item_id":"sku-1","user_id":"u1","quantity":1,"idempotency_key":"k"}`,
		`{"a":"\u00e9"}`, `{"a":"é"}`, `{"a":-0}`, `{"a":1e3}`, `{"a":"b","a":"c"}`, ` {"a" : "b" } `,
		`{"a":99999999999999999999}`, `{"a":"` + "\xff" + `"}`, `{"a":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := members(raw)
		if !ok {
			return
		}
		want, err := reference(raw)
		if err != nil {
			t.Fatalf("Object took %q, encoding/json refuses it: %v", raw, err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("Object(%q) = %v, encoding/json %v", raw, got, want)
		}
	})
}

func TestObjectKeys(t *testing.T) {
	for _, c := range []struct {
		raw  string
		keys []string
		ok   bool
	}{
		{`{"a":1,"b":{"c":[1,2]},"a":"x"}`, []string{"a", "b", "a"}, true},
		{` {"A\u0062":null} `, []string{"Ab"}, true},
		{`{}`, nil, true},
		{`[1]`, nil, false},
		{`not json`, nil, false},
		{`{"a":1,"b"`, []string{"a", "b"}, false},
		{`{"a":1,"b":}`, []string{"a", "b"}, false},
	} {
		keys, ok := ObjectKeys([]byte(c.raw))
		if ok != c.ok || !slices.Equal(keys, c.keys) {
			t.Errorf("ObjectKeys(%s) = %q, %v; want %q, %v", c.raw, keys, ok, c.keys, c.ok)
		}
	}
}
