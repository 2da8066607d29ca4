package admission

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// A Verifier answers every token as Parse does with the same key, also when
// its pooled HMACs are shared by goroutines.
func TestVerifierAgreesWithParse(t *testing.T) {
	key := []byte("0123456789abcdef-verifier")
	other := []byte("fedcba9876543210-other-key")
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	good, err := Mint(key, "itm-1", "buyer-1", time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := Mint(other, "itm-1", "buyer-1", time.Minute, now)
	expired, _ := Mint(key, "itm-1", "buyer-1", time.Second, now.Add(-time.Hour))
	tokens := []string{good, forged, expired, "", "v1.", good[:len(good)-1], good + "A", strings.Replace(good, "v1.", "v2.", 1),
		good[:strings.LastIndexByte(good, '.')] + "." + strings.Repeat("A", 43)}
	v, err := NewVerifier(key)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				for _, tok := range tokens {
					wc, werr := Parse(key, tok, now)
					gc, gerr := v.Parse(tok, now)
					if wc != gc || kind(gerr) != kind(werr) {
						t.Errorf("token %q: verifier %+v %v, Parse %+v %v", tok, gc, gerr, wc, werr)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if _, err := v.Parse(good, now); err != nil {
		t.Errorf("good token refused: %v", err)
	}
	if _, err := v.Parse(forged, now); !errors.Is(err, ErrBadSignature) {
		t.Errorf("forged token: %v, want ErrBadSignature", err)
	}
	if _, err := NewVerifier([]byte("short")); !errors.Is(err, ErrKey) {
		t.Errorf("short key: %v, want ErrKey", err)
	}
}

// kind is the sentinel an error wraps ("ok" for none).
func kind(err error) string {
	for _, s := range []error{ErrMalformed, ErrBadSignature, ErrExpired, ErrKey} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return "ok"
}

func BenchmarkParse(b *testing.B) {
	key := []byte("0123456789abcdef-verifier")
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	tok, _ := Mint(key, "itm-bench", "buyer-123456", time.Minute, now)
	b.Run("Parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Parse(key, tok, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	v, _ := NewVerifier(key)
	b.Run("Verifier", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := v.Parse(tok, now); err != nil {
				b.Fatal(err)
			}
		}
	})
}
