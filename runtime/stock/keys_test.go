package stock

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestReservationIDs(t *testing.T) {
	secret := []byte("0123456789abcdef")
	k := ReservationKey(secret, "c", "alice", "req-1")
	if k != ReservationKey(secret, "c", "alice", "req-1") {
		t.Fatal("the same request must give the same key")
	}
	for _, other := range []string{
		ReservationKey(secret, "c", "alice", "req-2"),
		ReservationKey(secret, "c", "bob", "req-1"),
		ReservationKey(secret, "d", "alice", "req-1"),
		ReservationKey([]byte("another secret!!"), "c", "alice", "req-1"),
		// Field boundaries are part of the MAC input.
		ReservationKey(secret, "c", "alicer", "eq-1"),
	} {
		if other == k {
			t.Fatalf("collision: %s", k)
		}
	}
	id := FormatID(7, k)
	shard, key, err := ParseID(id, 10)
	if err != nil || shard != 7 || key != k {
		t.Fatalf("ParseID(%q) = %d %q %v", id, shard, key, err)
	}
	for _, bad := range []string{"", "7", "7.", "x." + k, "10." + k, "-1." + k, "07." + k, "7." + k + "A", "7." + strings.Repeat("*", len(k))} {
		if _, _, err := ParseID(bad, 10); err == nil {
			t.Errorf("ParseID(%q) accepted", bad)
		}
	}
}

// TestReservationKeyIsStable pins the derivation: ids already in the ledger
// and in clients' retries must derive the same after an upgrade. The expected
// keys were computed independently (openssl dgst -sha256 -hmac over the same
// input, first 12 bytes, unpadded base64url).
func TestReservationKeyIsStable(t *testing.T) {
	for _, c := range []struct{ secret, campaign, user, request, want string }{
		{"0123456789abcdef0123456789abcdef", "5f0c6f4e-2d8a-4a57-9a3e-0c1f2b3c4d5e", "user-42", "req-7", "P2h3eMR_E5kswELe"},
		{"s", "", "ü", "|1:x", "iRrLv0AFchw9k33F"}, // byte lengths, separators inside fields
	} {
		if got := ReservationKey([]byte(c.secret), c.campaign, c.user, c.request); got != c.want {
			t.Errorf("ReservationKey(%q, %q, %q, %q) = %s, want %s", c.secret, c.campaign, c.user, c.request, got, c.want)
		}
		if got := NewKeyer([]byte(c.secret)).Key(c.campaign, c.user, c.request); got != c.want {
			t.Errorf("Keyer(%q).Key(%q, %q, %q) = %s, want %s", c.secret, c.campaign, c.user, c.request, got, c.want)
		}
	}
}

// A Keyer's pooled HMACs, reused by goroutines at once, give every key
// ReservationKey gives, and keep no state from one key to the next.
func TestKeyerAgreesWithReservationKey(t *testing.T) {
	secret := []byte("0123456789abcdef")
	k := NewKeyer(secret)
	want := func(user, req string) string { return ReservationKey(secret, "c", user, req) }
	given := secret
	secret = append([]byte(nil), secret...)
	given[0] = 'x' // the Keyer keeps its own copy of the secret
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				user, req := "u"+strconv.Itoa(g), "r"+strconv.Itoa(i)
				if got, want := k.Key("c", user, req), want(user, req); got != want {
					t.Errorf("Keyer.Key(c, %s, %s) = %s, ReservationKey %s", user, req, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkReservationKey(b *testing.B) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	b.Run("ReservationKey", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ReservationKey(secret, "5f0c6f4e-2d8a-4a57-9a3e-0c1f2b3c4d5e", "user-42", "req-7")
		}
	})
	b.Run("Keyer", func(b *testing.B) {
		k := NewKeyer(secret)
		b.ReportAllocs()
		for b.Loop() {
			k.Key("5f0c6f4e-2d8a-4a57-9a3e-0c1f2b3c4d5e", "user-42", "req-7")
		}
	})
}

func TestHomeShardIsStableAndSpread(t *testing.T) {
	counts := make([]int, 10)
	for i := range 10000 {
		u := "user-" + strconv.Itoa(i)
		h := HomeShard(u, 10)
		if h != HomeShard(u, 10) || h < 0 || h >= 10 {
			t.Fatalf("home shard of %s: %d", u, h)
		}
		counts[h]++
	}
	for s, n := range counts {
		if n < 700 || n > 1300 {
			t.Fatalf("shard %d is home to %d of 10000 users: %v", s, n, counts)
		}
	}
}

func TestKeysShareOneHashTag(t *testing.T) {
	uid := "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	k := ShardKeys(uid, 3)
	tag := "{fs:" + CampaignTag(uid) + ":3}"
	for _, key := range []string{k.Stock(), k.Meta(), k.Index(), k.Users(), k.Res("abc")} {
		if !strings.HasPrefix(key, tag+":") {
			t.Fatalf("%s lacks the shard's hash tag %s", key, tag)
		}
	}
	if len(CampaignTag(uid)) != 22 || CampaignTag("c-123") != "c-123" || CampaignTag(uid) == CampaignTag("7c9e6679-7425-40de-944b-e07fc1f90ae8") {
		t.Fatalf("campaign tag %q", CampaignTag(uid))
	}
}

func TestCheckVersion(t *testing.T) {
	for _, v := range []string{"7.0.15", "7.2.4", "8.0.1", "10.0.0"} {
		if err := checkVersion("r:6379", v); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
	for _, v := range []string{"6.2.14", "5.0.7"} {
		if err := checkVersion("r:6379", v); !errors.Is(err, ErrRedisTooOld) || !strings.Contains(err.Error(), "r:6379 runs "+v) {
			t.Errorf("%s: %v", v, err)
		}
	}
	for _, v := range []string{"", "x.y"} {
		if err := checkVersion("r:6379", v); err == nil || errors.Is(err, ErrRedisTooOld) {
			t.Errorf("%q: %v", v, err)
		}
	}
}

// A placed pointer reads back as written, with its buyer or (written by an
// older version) without one, and anything else is an error, not a placement.
func TestPlacementReadsBack(t *testing.T) {
	ptr := Pointer(2, 1700000000123)
	if p, err := parsePlacement(ptr, Buyer(3, "ann|with|bars"), 4); err != nil || p != (Placement{Shard: 2, ExpiryMs: 1700000000123, Quantity: 3, User: "ann|with|bars"}) {
		t.Fatalf("%q: %+v %v", ptr, p, err)
	}
	if p, err := parsePlacement(ptr, "", 4); err != nil || p != (Placement{Shard: 2, ExpiryMs: 1700000000123}) {
		t.Fatalf("pointer without a buyer: %+v %v", p, err)
	}
	if f := BuyerField("k"); !strings.HasPrefix(f, PointerFieldPrefix) {
		t.Fatalf("buyer field %q is not under the prefix buyer ids may not take", f)
	}
	for _, bad := range [][2]string{{"", ""}, {"c|123|1|ann", ""}, {"4|5", ""}, {"-1|5", ""}, {"1|x", ""}, {"1", ""},
		{"1|5", "0|ann"}, {"1|5", "1|"}, {"1|5", "1"}, {"1|5", "x|ann"}} {
		if p, err := parsePlacement(bad[0], bad[1], 4); err == nil {
			t.Errorf("%q, %q read as %+v, want an error", bad[0], bad[1], p)
		}
	}
}
