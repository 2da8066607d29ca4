package stock

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
)

// Keys names the Redis keys of one shard. They all carry the hash tag
// {fs:<campaign>:<shard>} so a script on the shard touches one cluster slot.
type Keys struct{ tag string }

// ShardKeys returns the key names of shard n of a campaign (the FlashSale UID).
func ShardKeys(campaign string, n int) Keys {
	return Keys{tag: "{fs:" + CampaignTag(campaign) + ":" + strconv.Itoa(n) + "}"}
}

// CampaignTag is the campaign's name inside keys: a UUID (a Kubernetes UID) is
// written as its 16 bytes in base64url (22 characters instead of 36), because the
// name is repeated in every reservation key and Redis memory per reservation counts.
// Anything else is used as it is.
func CampaignTag(campaign string) string {
	raw := strings.ReplaceAll(campaign, "-", "")
	if len(campaign) != 36 || len(raw) != 32 {
		return campaign
	}
	b, err := hex.DecodeString(raw)
	if err != nil {
		return campaign
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func (k Keys) Stock() string          { return k.tag + ":stock" }
func (k Keys) Meta() string           { return k.tag + ":meta" }
func (k Keys) Index() string          { return k.tag + ":index" }
func (k Keys) Users() string          { return k.tag + ":users" }
func (k Keys) Claims() string         { return k.tag + ":claims" }
func (k Keys) Paying() string         { return k.tag + ":paying" }
func (k Keys) ResPrefix() string      { return k.tag + ":res:" }
func (k Keys) Res(key string) string  { return k.tag + ":res:" + key }
func (k Keys) Pattern() string        { return k.tag + ":*" }
func campaignPattern(c string) string { return "{fs:" + CampaignTag(c) + ":*}:*" }

// HomeShard maps a user to the shard that holds the user's quota: a stable hash, so
// every process agrees without coordination.
func HomeShard(user string, shards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(user))
	return int(h.Sum32() % uint32(shards))
}

// keyBytes is the length of the HMAC prefix kept in a reservation key: 96 bits is
// unguessable and keeps keys short (Redis memory per reservation matters).
const keyBytes = 12

// ReservationKey derives the shard-independent part of a reservation id from the
// campaign, the user and the client's request id with a server-side secret. The same
// request always yields the same key (idempotency); clients cannot pick Redis keys.
func ReservationKey(secret []byte, campaign, user, requestID string) string {
	return reservationKey(hmac.New(sha256.New, secret), campaign, user, requestID)
}

// Keyer is ReservationKey for one secret, without keying a new HMAC for
// every key (two SHA-256 blocks of key schedule and a handful of
// allocations, on every reserve call): keyed HMACs are kept in a pool and
// Reset between keys, which returns one to its keyed state.
type Keyer struct {
	pool sync.Pool
}

// NewKeyer is a Keyer for secret.
func NewKeyer(secret []byte) *Keyer {
	k := append([]byte(nil), secret...)
	ky := &Keyer{}
	ky.pool.New = func() any { return hmac.New(sha256.New, k) }
	return ky
}

// Key is ReservationKey(secret, campaign, user, requestID).
func (k *Keyer) Key(campaign, user, requestID string) string {
	m := k.pool.Get().(hash.Hash)
	m.Reset()
	key := reservationKey(m, campaign, user, requestID)
	k.pool.Put(m)
	return key
}

// reservationKey is the key of the request with m, an HMAC in its keyed state.
func reservationKey(m hash.Hash, campaign, user, requestID string) string {
	// The MAC input is "<len>:<campaign>|<len>:<user>|<len>:<request id>" (byte
	// lengths), so that ("ab","c") and ("a","bc") never collide. It is built
	// without fmt: this runs on every reserve call.
	buf := make([]byte, 0, 3*(len(":|")+3)+len(campaign)+len(user)+len(requestID))
	for i, field := range [...]string{campaign, user, requestID} {
		if i > 0 {
			buf = append(buf, '|')
		}
		buf = strconv.AppendInt(buf, int64(len(field)), 10)
		buf = append(buf, ':')
		buf = append(buf, field...)
	}
	m.Write(buf)
	var sum [sha256.Size]byte
	return base64.RawURLEncoding.EncodeToString(m.Sum(sum[:0])[:keyBytes])
}

// FormatID is the reservation id given to clients: "<shard>.<key>", so checkout and
// cancel go straight to the shard.
func FormatID(shard int, key string) string { return strconv.Itoa(shard) + "." + key }

// ErrBadID is returned for a reservation id that is not "<shard>.<key>".
var ErrBadID = errors.New("malformed reservation id")

// ParseID splits a reservation id and checks it against the shard count.
func ParseID(id string, shards int) (int, string, error) {
	s, key, ok := strings.Cut(id, ".")
	if !ok || len(key) != base64.RawURLEncoding.EncodedLen(keyBytes) {
		return 0, "", ErrBadID
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= shards || strconv.Itoa(n) != s {
		return 0, "", ErrBadID
	}
	if _, err := base64.RawURLEncoding.DecodeString(key); err != nil {
		return 0, "", ErrBadID
	}
	return n, key, nil
}

// PointerFieldPrefix begins the users-hash fields that hold pointers
// ("p:<reservation key>", see quota.lua); the other fields are buyer ids, so
// no buyer id may begin with it.
const PointerFieldPrefix = "p:"

// Pointer is the users-hash value on the home shard that names a reservation
// placed on another shard: "<shard>|<expiry ms>". The expiry tells one
// placement of a request from another, so a give-back acts only on its own.
func Pointer(shard int, expiryMs int64) string {
	return strconv.Itoa(shard) + "|" + strconv.FormatInt(expiryMs, 10)
}

// BuyerField is the users-hash field beside a pointer (PointerFieldPrefix and
// the key) that names its buyer, "<quantity>|<buyer>" (Buyer): the quota can
// then be given back when nothing else names the buyer (the reservation is
// gone and its ledger row was never written). A field of its own, so that a
// version reading only the pointer still reads it.
func BuyerField(key string) string { return PointerFieldPrefix + key + "|b" }

// Buyer is BuyerField's value.
func Buyer(qty int, user string) string { return strconv.Itoa(qty) + "|" + user }

// Placement is a placed pointer read back with its buyer. User is empty and
// Quantity 0 for a pointer without one (written by an older version).
type Placement struct {
	Shard    int
	ExpiryMs int64
	Quantity int
	User     string
}

// parsePlacement reads a placed pointer and its buyer ("" for none) in a
// store of shards shards.
func parsePlacement(ptr, buyer string, shards int) (Placement, error) {
	target, expiry, ok := strings.Cut(ptr, "|")
	shard, err := strconv.Atoi(target)
	if !ok || err != nil || shard < 0 || shard >= shards {
		return Placement{}, fmt.Errorf("malformed pointer %q", ptr)
	}
	p := Placement{Shard: shard}
	if p.ExpiryMs, err = strconv.ParseInt(expiry, 10, 64); err != nil {
		return Placement{}, fmt.Errorf("malformed pointer %q", ptr)
	}
	if buyer == "" {
		return p, nil
	}
	qty, user, ok := strings.Cut(buyer, "|")
	if p.Quantity, err = strconv.Atoi(qty); !ok || err != nil || p.Quantity <= 0 || user == "" {
		return Placement{}, fmt.Errorf("malformed buyer %q of pointer %q", buyer, ptr)
	}
	p.User = user
	return p, nil
}
