package admission

import (
	"testing"
	"time"
)

// What plainClaims takes, encoding/json reads into the same claims; what Mint
// writes, plainClaims takes.
func FuzzPlainClaimsAgreeWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{"sku":"itm-1","sub":"u-1","exp":1893456000}`, `{"sub":"u","sku":"s","exp":-1}`, `{"sku":"a","sku":"b","sub":"u","exp":1}`,
		`{"sku":"a","sub":"u","exp":1,"x":1}`, `{"sku":1,"sub":"u","exp":1}`, `{"sku":"a","sub":"u","exp":"1"}`, `{"sku":"\u00e9","sub":"u","exp":1}`,
		`{"SKU":"a","sub":"u","exp":1}`, `{}`, `{"exp":1.5}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, ok := plainClaims(payload)
		if !ok {
			return
		}
		want, ok := decodeClaims(payload)
		if !ok {
			t.Fatalf("plainClaims took %q, encoding/json refuses it", payload)
		}
		if got != want {
			t.Fatalf("%q: plainClaims %+v, encoding/json %+v", payload, got, want)
		}
	})
}

func TestMintedTokensTakeThePlainForm(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_800_000_000, 0)
	tok, err := Mint(key, "itm-ps5 ✓", "u-1", time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := b64.DecodeString(tok[len(prefix) : len(tok)-b64.EncodedLen(32)-1])
	if err != nil {
		t.Fatal(err)
	}
	c, ok := plainClaims(payload)
	if want := (Claims{SKU: "itm-ps5 ✓", Subject: "u-1", Expiry: now.Add(time.Minute).Unix()}); !ok || c != want {
		t.Fatalf("plainClaims(%s) = %+v, %v; want %+v, true", payload, c, ok, want)
	}
}
