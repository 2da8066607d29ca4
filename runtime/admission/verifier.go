package admission

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"sync"
	"time"
)

// Verifier parses tokens signed with one key, as Parse does, without keying
// a new HMAC for every token: a keyed HMAC is kept in a pool and Reset
// between tokens (Reset returns it to its keyed state, so the key's two
// hashed blocks are not recomputed and nothing is allocated).
type Verifier struct {
	pool sync.Pool
}

// NewVerifier is a Verifier for key (at least MinKeyLen bytes).
func NewVerifier(key []byte) (*Verifier, error) {
	if len(key) < MinKeyLen {
		return nil, ErrKey
	}
	k := append([]byte(nil), key...)
	v := &Verifier{}
	v.pool.New = func() any { return hmac.New(sha256.New, k) }
	return v, nil
}

// Parse is admission.Parse with the Verifier's key.
func (v *Verifier) Parse(token string, now time.Time) (Claims, error) {
	return parse(token, now, v.mac)
}

func (v *Verifier) mac(signed string, into []byte) []byte {
	m := v.pool.Get().(hash.Hash)
	m.Reset()
	_, _ = m.Write([]byte(signed))
	out := m.Sum(into)
	v.pool.Put(m)
	return out
}
