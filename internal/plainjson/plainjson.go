// Package plainjson reads the plain form of a flat JSON object: one object
// whose values are strings without escapes or integers, the form every
// well-behaved client sends. It reads it in one pass over the bytes, without
// the reflection, the interface values and the allocations of encoding/json,
// and it says no to anything else: the caller then decodes with
// encoding/json, whose answers (values and error messages) stay the
// reference. A no says nothing about whether the input is valid JSON.
package plainjson

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// Value is one member's value: a string, or an integer when IsInt.
type Value struct {
	// Str is the string's bytes, a slice of the input: valid UTF-8 without
	// escapes or control bytes, so exactly what encoding/json would decode.
	Str   []byte
	Int   int64
	IsInt bool
}

// maxDigits keeps every integer inside int64 (and int on 64-bit machines):
// a longer one is encoding/json's to refuse or accept.
const maxDigits = 18

// Object calls member for each member of raw, in order, and reports whether
// raw is one plain object and member took every member (a member func
// returns false for a key it does not know, a value of the wrong kind or a
// key it has already seen). raw is plain when it holds one JSON object, with
// JSON whitespace around and between its tokens, whose keys are strings
// without escapes and whose values are strings without escapes or control
// bytes, in valid UTF-8, or integers of at most 18 digits, without fraction
// or exponent. member may have been called for some members when Object
// returns false.
func Object(raw []byte, member func(key []byte, v Value) bool) bool {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return skipSpace(raw, i+1) == len(raw)
	}
	for {
		key, j, ok := str(raw, i)
		if !ok {
			return false
		}
		i = skipSpace(raw, j)
		if i >= len(raw) || raw[i] != ':' {
			return false
		}
		i = skipSpace(raw, i+1)
		var v Value
		if i < len(raw) && raw[i] == '"' {
			v.Str, j, ok = str(raw, i)
		} else {
			v.Int, j, ok = integer(raw, i)
			v.IsInt = true
		}
		if !ok || !member(key, v) {
			return false
		}
		i = skipSpace(raw, j)
		if i >= len(raw) {
			return false
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case '}':
			return skipSpace(raw, i+1) == len(raw)
		default:
			return false
		}
	}
}

// skipSpace skips JSON's four whitespace bytes from i.
func skipSpace(raw []byte, i int) int {
	for i < len(raw) {
		switch raw[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// str reads the string that starts at raw[i] and returns its bytes and the
// index after its closing quote.
func str(raw []byte, i int) ([]byte, int, bool) {
	if i >= len(raw) || raw[i] != '"' {
		return nil, 0, false
	}
	ascii := true
	for j := i + 1; j < len(raw); j++ {
		switch c := raw[j]; {
		case c == '"':
			s := raw[i+1 : j]
			if !ascii && !utf8.Valid(s) {
				return nil, 0, false // encoding/json would replace the bad bytes
			}
			return s, j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, 0, false
}

// integer reads the integer that starts at raw[i] and returns it and the
// index after its last digit.
func integer(raw []byte, i int) (int64, int, bool) {
	neg := i < len(raw) && raw[i] == '-'
	if neg {
		i++
	}
	start := i
	var n int64
	for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' && i-start < maxDigits {
		n = n*10 + int64(raw[i]-'0')
		i++
	}
	if i == start || (i-start > 1 && raw[start] == '0') {
		return 0, 0, false // no digit, or a leading zero JSON does not allow
	}
	if i < len(raw) {
		switch raw[i] {
		case '.', 'e', 'E', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			return 0, 0, false // a fraction, an exponent or a 19th digit
		}
	}
	if neg {
		n = -n
	}
	return n, i, true
}

// ObjectKeys lists the top-level keys of raw, any JSON object (not only the
// plain form), in order and with repeats, through encoding/json's tokens: for
// callers that refuse unknown, repeated or mis-cased keys in what Object did
// not take, which encoding/json's decoder matches case-insensitively and
// keeps the last of. ok is false when raw is not one well-formed object;
// keys then holds those read before the fault.
func ObjectKeys(raw []byte) (keys []string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		t, err := dec.Token()
		k, isKey := t.(string)
		if err != nil || !isKey {
			return keys, false
		}
		keys = append(keys, k)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return keys, false
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return keys, false
	}
	return keys, true
}
