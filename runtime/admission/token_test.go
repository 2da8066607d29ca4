package admission

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

var (
	key   = []byte("0123456789abcdef-admission")
	other = []byte("fedcba9876543210-admission")
	t0    = time.Unix(1_800_000_000, 0)
)

func mint(t testing.TB, sku, user string, ttl time.Duration) string {
	t.Helper()
	tok, err := Mint(key, sku, user, ttl, t0)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// forge signs an arbitrary payload with k, to build tokens Mint refuses to make.
func forge(k []byte, payload string) string {
	return signRaw(k, prefix+b64.EncodeToString([]byte(payload)))
}

// signRaw signs a token body as is, payload encoding included.
func signRaw(k []byte, signed string) string {
	return signed + "." + b64.EncodeToString(sign(k, signed))
}

func TestMintFormat(t *testing.T) {
	tok := mint(t, "itm-ps5-pro", "u-1", 10*time.Minute)
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] != "v1" {
		t.Fatalf("token %q is not v1.<payload>.<mac>", tok)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"sku":"itm-ps5-pro","sub":"u-1","exp":1800000600}`; string(payload) != want {
		t.Fatalf("payload %s, want %s", payload, want)
	}
	if mac, err := base64.RawURLEncoding.DecodeString(parts[2]); err != nil || len(mac) != 32 {
		t.Fatalf("mac %q: %d bytes, %v", parts[2], len(mac), err)
	}
}

func TestVerify(t *testing.T) {
	good := mint(t, "itm-1", "alice", time.Minute)
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	macAt := strings.LastIndexByte(good, '.') + 1
	for _, tc := range []struct {
		name      string
		key       []byte
		token     string
		sku, user string
		now       time.Time
		want      error
	}{
		{"valid", key, good, "itm-1", "alice", t0, nil},
		{"valid until the last second", key, good, "itm-1", "alice", t0.Add(59 * time.Second), nil},
		{"expired at exp", key, good, "itm-1", "alice", t0.Add(time.Minute), ErrExpired},
		{"expired long ago", key, good, "itm-1", "alice", t0.Add(time.Hour), ErrExpired},
		{"other sku", key, good, "itm-2", "alice", t0, ErrWrongSKU},
		{"other user", key, good, "itm-1", "bob", t0, ErrWrongUser},
		{"other key", other, good, "itm-1", "alice", t0, ErrBadSignature},
		{"payload changed", key, flip(good, 5), "itm-1", "alice", t0, ErrBadSignature},
		{"mac changed", key, flip(good, macAt+3), "itm-1", "alice", t0, ErrBadSignature},
		{"mac truncated", key, good[:len(good)-1], "itm-1", "alice", t0, ErrMalformed},
		{"mac with padding", key, good + "=", "itm-1", "alice", t0, ErrMalformed},
		{"empty", key, "", "itm-1", "alice", t0, ErrMalformed},
		{"no version", key, good[3:], "itm-1", "alice", t0, ErrMalformed},
		{"other version", key, "v2" + good[2:], "itm-1", "alice", t0, ErrMalformed},
		{"extra part", key, "v1.x" + good[2:], "itm-1", "alice", t0, ErrMalformed},
		{"two parts", key, "v1." + good[macAt:], "itm-1", "alice", t0, ErrMalformed},
		{"unsigned junk payload", key, "v1.!!!." + good[macAt:], "itm-1", "alice", t0, ErrBadSignature},
		{"signed junk payload", key, signRaw(key, "v1.!!!"), "itm-1", "alice", t0, ErrMalformed},
		{"huge", key, "v1." + strings.Repeat("A", MaxTokenLen) + "." + good[macAt:], "itm-1", "alice", t0, ErrMalformed},
		{"signed garbage", key, forge(key, "not json"), "itm-1", "alice", t0, ErrMalformed},
		{"signed unknown field", key, forge(key, `{"sku":"itm-1","sub":"alice","exp":1800000600,"adm":true}`), "itm-1", "alice", t0, ErrMalformed},
		{"signed missing sub", key, forge(key, `{"sku":"itm-1","exp":1800000600}`), "itm-1", "", t0, ErrMalformed},
		{"signed exp as string", key, forge(key, `{"sku":"itm-1","sub":"alice","exp":"1800000600"}`), "itm-1", "alice", t0, ErrMalformed},
		{"signed two objects", key, forge(key, `{"sku":"itm-1","sub":"alice","exp":1800000600}{}`), "itm-1", "alice", t0, ErrMalformed},
		{"signed long sub", key, forge(key, `{"sku":"itm-1","sub":"`+strings.Repeat("a", MaxFieldLen+1)+`","exp":1800000600}`), "itm-1", "alice", t0, ErrMalformed},
		// A signer that templates the buyer's name into the payload must not
		// be made to sign another buyer's token: a second sub, or one spelt
		// in other case, is no sub.
		{"signed duplicate sub", key, forge(key, `{"sku":"itm-1","sub":"x","sub":"alice","exp":1800000600}`), "itm-1", "alice", t0, ErrMalformed},
		{"signed upper-case SUB", key, forge(key, `{"sku":"itm-1","SUB":"alice","exp":1800000600}`), "itm-1", "alice", t0, ErrMalformed},
		{"signed escaped sub", key, forge(key, `{"sku":"itm-1","sub":"al\u0069ce","exp":1800000060}`), "itm-1", "alice", t0, nil},
		{"short key", key[:8], good, "itm-1", "alice", t0, ErrKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Verify(tc.key, tc.token, tc.sku, tc.user, tc.now)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.want == nil && (c.SKU != tc.sku || c.Subject != tc.user || !c.ExpiresAt().Equal(t0.Add(time.Minute))) {
				t.Fatalf("claims %+v", c)
			}
			if Forbidden(err) != (tc.want == ErrWrongSKU || tc.want == ErrWrongUser) {
				t.Fatalf("Forbidden(%v) = %v", err, Forbidden(err))
			}
		})
	}
}

func TestMintRefuses(t *testing.T) {
	for _, tc := range []struct {
		name      string
		key       []byte
		sku, user string
		ttl       time.Duration
	}{
		{"short key", []byte("short"), "s", "u", time.Minute},
		{"no sku", key, "", "u", time.Minute},
		{"no user", key, "s", "", time.Minute},
		{"long user", key, "s", strings.Repeat("u", MaxFieldLen+1), time.Minute},
		{"invalid utf-8", key, "s", "\xff", time.Minute},
		{"zero ttl", key, "s", "u", 0},
		{"negative ttl", key, "s", "u", -time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tok, err := Mint(tc.key, tc.sku, tc.user, tc.ttl, t0); err == nil {
				t.Fatalf("minted %q", tok)
			}
		})
	}
}

// FuzzParse: no input panics, and only a token exactly as Mint writes it for the
// claims it carries is accepted (the MAC pins every byte; strict base64 leaves no
// second spelling of the same bytes).
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", ".", "..", "v1..", "v1.e30.", "v1.e30.AAAA",
		mint(f, "itm-1", "alice", time.Minute),
		mint(f, "itm-ps5-pro", "u-123", 24*time.Hour),
		mint(f, "日本", "ユーザー", time.Second),
		forge(key, `{"sku":"itm-1","sub":"alice","exp":1800000600,"x":1}`),
		forge(key, `{"sku":"itm-1","sub":"alice","exp":1e30}`),
		forge(key, `null`),
		forge(other, `{"sku":"itm-1","sub":"alice","exp":1800000600}`),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		c, err := Parse(key, token, t0)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrBadSignature) && !errors.Is(err, ErrExpired) {
				t.Fatalf("unexpected error kind %v", err)
			}
			return
		}
		if c.SKU == "" || c.Subject == "" || len(c.SKU) > MaxFieldLen || len(c.Subject) > MaxFieldLen || c.Expiry <= t0.Unix() {
			t.Fatalf("accepted invalid claims %+v", c)
		}
		again, err := Mint(key, c.SKU, c.Subject, c.ExpiresAt().Sub(t0), t0)
		if err != nil || again != token {
			t.Fatalf("accepted %q, which is not what Mint writes for %+v (%q, %v)", token, c, again, err)
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	tok := mint(b, "itm-ps5-pro", "u-123456", time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Verify(key, tok, "itm-ps5-pro", "u-123456", t0); err != nil {
			b.Fatal(err)
		}
	}
}
