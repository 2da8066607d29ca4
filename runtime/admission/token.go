// Package admission mints and verifies admission tokens: what a waiting room hands
// a buyer to let them into one flash sale. A token is an HMAC-SHA256 over the SKU,
// the user and an expiry, so the reservation API checks it without any lookup.
//
// Format (ASCII, URL-safe, no padding):
//
//	v1.<payload>.<mac>
//	payload = base64url(JSON {"sku":"<sku>","sub":"<user>","exp":<unix seconds>})
//	mac     = base64url(HMAC-SHA256(key, "v1." + payload))
//
// The MAC is checked (in constant time) before the payload is decoded, so an
// unsigned payload is never parsed. A token is valid while now < exp.
package admission

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/flashsale-dev/flashsale-operator/internal/plainjson"
)

// Version is the format prefix; a new format gets a new prefix so both can be
// accepted during a key or format rotation.
const Version = "v1"

// Limits. MaxTokenLen bounds the work done on an untrusted header before the MAC
// check; MaxFieldLen bounds sku and sub in bytes (the API bounds user_id at as
// many characters: the same bound for ASCII ids).
const (
	MinKeyLen   = 16
	MaxFieldLen = 128
	MaxTokenLen = 1024
)

// Errors. Malformed, bad signature and expired mean "not a valid token" (HTTP 401);
// wrong SKU and wrong user mean "a valid token, but not for this" (HTTP 403).
var (
	ErrMalformed    = errors.New("admission token is malformed")
	ErrBadSignature = errors.New("admission token signature is invalid")
	ErrExpired      = errors.New("admission token has expired")
	ErrWrongSKU     = errors.New("admission token is for another SKU")
	ErrWrongUser    = errors.New("admission token is for another user")
	ErrKey          = fmt.Errorf("admission key must be at least %d bytes", MinKeyLen)
)

// Forbidden reports whether err is a valid token used for the wrong SKU or user.
func Forbidden(err error) bool {
	return errors.Is(err, ErrWrongSKU) || errors.Is(err, ErrWrongUser)
}

// Claims are what a token says.
type Claims struct {
	SKU     string `json:"sku"`
	Subject string `json:"sub"` // the user
	Expiry  int64  `json:"exp"` // unix seconds
}

// ExpiresAt is the expiry as a time.
func (c Claims) ExpiresAt() time.Time { return time.Unix(c.Expiry, 0) }

func (c Claims) validate() error {
	for _, f := range []struct{ name, v string }{{"sku", c.SKU}, {"user (sub)", c.Subject}} {
		if f.v == "" || len(f.v) > MaxFieldLen || !utf8.ValidString(f.v) {
			return fmt.Errorf("%s must be 1..%d bytes of UTF-8", f.name, MaxFieldLen)
		}
	}
	if c.Expiry <= 0 {
		return errors.New("exp must be positive")
	}
	return nil
}

var b64 = base64.RawURLEncoding.Strict()

const prefix = Version + "."

// Mint issues a token for user on sku, valid for ttl from now.
func Mint(key []byte, sku, user string, ttl time.Duration, now time.Time) (string, error) {
	if len(key) < MinKeyLen {
		return "", ErrKey
	}
	if ttl <= 0 {
		return "", fmt.Errorf("admission token ttl must be positive, got %s", ttl)
	}
	c := Claims{SKU: sku, Subject: user, Expiry: now.Add(ttl).Unix()}
	if err := c.validate(); err != nil {
		return "", fmt.Errorf("admission token: %w", err)
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	signed := prefix + b64.EncodeToString(payload)
	return signed + "." + b64.EncodeToString(sign(key, signed)), nil
}

// Parse checks a token's format, MAC and expiry and returns its claims. It does not
// check what the token is for: see Verify and Claims.Check.
func Parse(key []byte, token string, now time.Time) (Claims, error) {
	if len(key) < MinKeyLen {
		return Claims{}, ErrKey
	}
	return parse(token, now, func(signed string, into []byte) []byte { return append(into, sign(key, signed)...) })
}

// parse is Parse with the signing given: mac appends the HMAC of signed.
func parse(token string, now time.Time, mac func(signed string, into []byte) []byte) (Claims, error) {
	if len(token) > MaxTokenLen || !strings.HasPrefix(token, prefix) {
		return Claims{}, ErrMalformed
	}
	dot := strings.LastIndexByte(token, '.')
	if dot < len(prefix) {
		return Claims{}, ErrMalformed
	}
	signed, macText := token[:dot], token[dot+1:]
	if strings.IndexByte(signed[len(prefix):], '.') >= 0 || len(macText) != b64.EncodedLen(sha256.Size) {
		return Claims{}, ErrMalformed
	}
	var got, want [sha256.Size]byte
	if n, err := b64.Decode(got[:], []byte(macText)); err != nil || n != sha256.Size {
		return Claims{}, ErrMalformed
	}
	if !hmac.Equal(got[:], mac(signed, want[:0])) {
		return Claims{}, ErrBadSignature
	}
	payload, err := b64.DecodeString(signed[len(prefix):])
	if err != nil {
		return Claims{}, ErrMalformed
	}
	c, ok := plainClaims(payload)
	if !ok {
		// Not the plain form Mint writes: encoding/json decides.
		if c, ok = decodeClaims(payload); !ok {
			return Claims{}, ErrMalformed
		}
	}
	if err := c.validate(); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if now.Unix() >= c.Expiry {
		return c, ErrExpired
	}
	return c, nil
}

// decodeClaims reads any payload with encoding/json: exactly one object of
// sku, sub and exp, each spelled so and given once; false for anything else.
// encoding/json alone would match "SUB" to sub and keep the last of two
// subs, so a signer that templated a buyer's name into the payload could be
// made to sign another buyer's token.
func decodeClaims(payload []byte) (Claims, bool) {
	if !exactKeys(payload) {
		return Claims{}, false
	}
	var c Claims
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || dec.More() {
		return Claims{}, false
	}
	return c, true
}

// exactKeys tells whether payload is an object whose keys are among sku, sub
// and exp, each at most once (a missing one is validate's to refuse).
func exactKeys(payload []byte) bool {
	keys, ok := plainjson.ObjectKeys(payload)
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] || (k != "sku" && k != "sub" && k != "exp") {
			return false
		}
		seen[k] = true
	}
	return ok
}

// plainClaims reads a payload in the plain form Mint writes (one object of
// sku, sub and exp, each once) without encoding/json; false for any other
// payload, which the general decoder then reads or refuses.
func plainClaims(payload []byte) (Claims, bool) {
	var c Claims
	var seen [3]bool
	ok := plainjson.Object(payload, func(key []byte, v plainjson.Value) bool {
		var i int
		switch string(key) {
		case "sku":
			i, c.SKU = 0, string(v.Str)
		case "sub":
			i, c.Subject = 1, string(v.Str)
		case "exp":
			i, c.Expiry = 2, v.Int
		default:
			return false
		}
		if seen[i] || v.IsInt != (i == 2) {
			return false
		}
		seen[i] = true
		return true
	})
	return c, ok
}

// Check reports whether the claims are for sku and user.
func (c Claims) Check(sku, user string) error {
	// Neither value is secret; plain comparison leaks nothing an attacker lacks.
	if c.SKU != sku {
		return ErrWrongSKU
	}
	if c.Subject != user {
		return ErrWrongUser
	}
	return nil
}

// Verify is Parse followed by Check.
func Verify(key []byte, token, sku, user string, now time.Time) (Claims, error) {
	c, err := Parse(key, token, now)
	if err != nil {
		return c, err
	}
	return c, c.Check(sku, user)
}

func sign(key []byte, signed string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(signed))
	return m.Sum(nil)
}
