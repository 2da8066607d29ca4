package stock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Gate states stored in a shard's meta. Only OPEN admits reservations.
const (
	StateOpen       = "OPEN"
	StateNotStarted = "NOT_STARTED"
	StatePaused     = "PAUSED"
	StateEnded      = "ENDED"
	StateRebuilding = "REBUILDING"
	// StateFailClosed is written by the controller when Redis can no longer be
	// trusted (e.g. it restarted from an old snapshot) until the rebuild.
	StateFailClosed = "FAIL_CLOSED"
)

// Closed reasons returned by the reserve script besides the gate states.
const (
	ReasonNoMeta     = "NO_META"
	ReasonStaleEpoch = "STALE_EPOCH"
	// ReasonUnverified: the shard's data was written by another server process
	// than the one holding it now (a restart from a snapshot, a promoted
	// replica), so it may be older than the ledger: closed until rebuilt.
	ReasonUnverified = "UNVERIFIED"
)

// DefaultBackstop is the TTL of a reservation hash: a safety net only. The business
// TTL lives in the expiry index and the sweeper deletes released reservations.
// A campaign whose reservations live longer sets BackstopFor their lifetime.
const DefaultBackstop = 24 * time.Hour

// BackstopFor is the reservation hash TTL of a campaign whose reservations
// may be held for lifetime (TTL plus grace): DefaultBackstop beyond it. A
// hash that expired before the sweeper's turn would take its unit with it:
// the release would find nothing to give back.
func BackstopFor(lifetime time.Duration) time.Duration {
	return addCapped(DefaultBackstop, max(lifetime, 0))
}

// maxBackstop bounds the hash TTL: Redis refuses EXPIRE times that overflow,
// and a duration sum could.
const maxBackstop = 10 * 365 * 24 * time.Hour

// addCapped is a + b (both at least 0), at most maxBackstop, without overflow.
func addCapped(a, b time.Duration) time.Duration {
	return min(a+min(b, maxBackstop), maxBackstop)
}

// Code is the outcome of one reserve script call on one shard.
type Code int

const (
	Reserved Code = 1
	Replay   Code = 2
	SoldOut  Code = 3
	Limit    Code = 4
	Closed   Code = 5
	Claimed  Code = 6
	Busy     Code = 7
)

func (c Code) String() string {
	switch c {
	case Reserved:
		return "RESERVED"
	case Replay:
		return "REPLAY"
	case SoldOut:
		return "SOLD_OUT"
	case Limit:
		return "LIMIT"
	case Closed:
		return "CLOSED"
	case Claimed:
		return "CLAIMED"
	case Busy:
		return "BUSY"
	}
	return "CODE_" + strconv.Itoa(int(c))
}

// Mode tells the reserve script which part of the per-user logic runs on this shard.
type Mode string

const (
	ModeHome  Mode = "home"  // the user's home shard, no stealing
	ModeClaim Mode = "claim" // home shard; on sold out, claim the quota for stealing
	ModeSteal Mode = "steal" // another shard; the quota was claimed on the home shard
)

// Store runs the scripts of one campaign's shards.
type Store struct {
	rdb      redis.UniversalClient
	campaign string
	shards   []Keys
	backstop time.Duration
	servers  sync.Map // server address -> *serverScript
}

// New returns the Store of a campaign with the given number of shards.
func New(rdb redis.UniversalClient, campaign string, shards int) *Store {
	ks := make([]Keys, shards)
	for i := range ks {
		ks[i] = ShardKeys(campaign, i)
	}
	return &Store{rdb: rdb, campaign: campaign, shards: ks, backstop: DefaultBackstop}
}

// WithBackstop sets the reservation hash TTL (see BackstopFor); call it before
// the Store is used.
func (s *Store) WithBackstop(d time.Duration) *Store {
	s.backstop = d
	return s
}

// Shards is the number of shards.
func (s *Store) Shards() int { return len(s.shards) }

// Client is the Redis client the store runs on.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// Keys returns the key names of shard n.
func (s *Store) Keys(n int) Keys { return s.shards[n] }

// ShardResult is what the reserve script said.
type ShardResult struct {
	Code     Code
	ExpiryMs int64 // Redis clock, ms since the Unix epoch
	Epoch    int64 // the shard's epoch
	// Extra: stock left (Reserved), shard (Replay, -1 = this one), units the
	// user holds (Limit, SoldOut, Claimed).
	Extra int64
	// Status: R/C (Replay), the closed reason (Closed), or the claim's stamp
	// (Claimed), which ConfirmClaim and Unclaim name.
	Status string
}

// ReserveRequest is one reserve script call.
type ReserveRequest struct {
	Shard, Home int
	Mode        Mode
	User, Key   string
	Quantity    int
	MaxPerUser  int
	TTL         time.Duration
	MinEpoch    int64
}

// Reserve runs the reserve script on one shard.
func (s *Store) Reserve(ctx context.Context, r ReserveRequest) (ShardResult, error) {
	k := s.shards[r.Shard]
	v, err := s.runReserve(ctx, k.Meta(),
		[]string{k.Stock(), k.Meta(), k.Index(), k.Res(r.Key), k.Users(), k.Claims()},
		r.User, r.Key, r.Quantity, r.MaxPerUser, r.TTL.Milliseconds(),
		int64(s.backstop/time.Second), r.MinEpoch, string(r.Mode), r.Home,
	)
	if err != nil {
		return ShardResult{}, fmt.Errorf("reserve on shard %d: %w", r.Shard, err)
	}
	if len(v) != 5 {
		return ShardResult{}, fmt.Errorf("reserve on shard %d: unexpected reply %v", r.Shard, v)
	}
	return ShardResult{
		Code:     Code(toInt(v[0])),
		ExpiryMs: toInt(v[1]),
		Epoch:    toInt(v[2]),
		Extra:    toInt(v[3]),
		Status:   toString(v[4]),
	}, nil
}

// runReserve runs the reserve script on the server holding key, as loaded for
// that server process (see reserve.lua). It runs on that server's own client,
// never through cluster redirections, so a body never runs on another server
// than the one it was loaded for. NOSCRIPT means a new server process (or
// SCRIPT FLUSH): the script is loaded again for the run id the server has now.
func (s *Store) runReserve(ctx context.Context, key string, keys []string, args ...any) ([]any, error) {
	node, err := s.node(ctx, key)
	if err != nil {
		return nil, err
	}
	srv := s.server(node.Options().Addr)
	cur := srv.loaded.Load()
	if cur == nil {
		cur, err = s.loadReserve(ctx, node, srv, nil)
	}
	var v []any
	if err == nil {
		v, err = evalShaOnce(ctx, node, ReserveScriptFor(cur.runID).Hash(), keys, args...).Slice()
	}
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if cur, err = s.loadReserve(ctx, node, srv, cur); err == nil {
			v, err = evalShaOnce(ctx, node, ReserveScriptFor(cur.runID).Hash(), keys, args...).Slice()
		}
	}
	s.redirected(ctx, err) // a failed load too: the node may be gone
	return v, err
}

// node is the client of the server holding key: the client itself, or the
// cluster master of the key's slot.
func (s *Store) node(ctx context.Context, key string) (*redis.Client, error) {
	switch c := s.rdb.(type) {
	case *redis.Client:
		return c, nil
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	}
	return nil, fmt.Errorf("unsupported redis client %T", s.rdb)
}

// redirected asks the cluster client to reload its slot map when a call that
// went straight to a node failed for a reason the map may explain: MOVED or
// ASK (a slot moved), CLUSTERDOWN, or no answer at all (a node down, maybe
// failed over). The caller's retry then goes to the right server.
func (s *Store) redirected(ctx context.Context, err error) {
	c, ok := s.rdb.(*redis.ClusterClient)
	if !ok || err == nil {
		return
	}
	var reply redis.Error
	if !errors.As(err, &reply) || redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") ||
		redis.HasErrorPrefix(err, "CLUSTERDOWN") {
		c.ReloadState(ctx)
	}
}

// ErrRedisTooOld: a server runs a Redis older than 7.0. Older servers copy
// SCRIPT LOAD to their replicas and their AOF, so a promoted replica, or a
// server restarted from its AOF, would hold a reserve script body loaded for
// another process and accept its possibly older data (see reserve.lua).
var ErrRedisTooOld = errors.New("the shards need Redis 7.0 or later")

// runID reads node's run id, and refuses a server older than 7.0.
func runID(ctx context.Context, node *redis.Client) (string, error) {
	info, err := node.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	return runIDFrom(node.Options().Addr, info)
}

// runIDFrom is the run id in an INFO answer that has its server section.
func runIDFrom(addr, info string) (string, error) {
	if err := checkVersion(addr, infoField(info, "redis_version")); err != nil {
		return "", err
	}
	id := infoField(info, "run_id")
	if id == "" {
		return "", fmt.Errorf("%s: INFO server has no run_id", addr)
	}
	return id, nil
}

// Stamp records the run id of the server holding each shard in the metas that
// have none (shards seeded before metas recorded it), so that the reserve
// script can tell from then on when their data comes from another server
// process. Call it only after checking that the servers did not restart. It
// returns how many shards it stamped.
func (s *Store) Stamp(ctx context.Context) (int, error) {
	pipe := s.rdb.Pipeline()
	has := make([]*redis.BoolCmd, len(s.shards))
	for i, k := range s.shards {
		has[i] = pipe.HExists(ctx, k.Meta(), "srv")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	stamped := 0
	for i, k := range s.shards {
		if has[i].Val() {
			continue
		}
		n, err := stampScript.Run(ctx, s.rdb, []string{k.Meta()}).Int()
		if err != nil {
			return stamped, fmt.Errorf("stamp shard %d: %w", i, err)
		}
		stamped += n
	}
	return stamped, nil
}

// Unverified lists the shards of states (from State) whose meta was written
// by another server process than the one holding them now (see reserve.lua):
// restarted from a snapshot, or a replica promoted by a failover. Their stock
// may be older than the ledger; the reserve script refuses them until they are
// rebuilt.
func Unverified(states []ShardState) []int {
	var out []int
	for _, st := range states {
		if st.Unverified {
			out = append(out, st.Index)
		}
	}
	return out
}

// ReleaseCode is the outcome of release.lua and cancel.lua.
type ReleaseCode int

const (
	NotFound    ReleaseCode = 0
	Released    ReleaseCode = 1
	NotReserved ReleaseCode = 2 // committed
	WrongUser   ReleaseCode = 3
	Rebuilding  ReleaseCode = 4
	// LedgerNeeded: the reservation's hash is gone but its expiry-index entry
	// says its units were never given back: call ReleaseFromLedger.
	LedgerNeeded ReleaseCode = 5
)

// ReleaseResult says what a release did; when Home differs from the shard, the
// caller gives the user's quota back on the home shard (Quota with QuotaRelease).
type ReleaseResult struct {
	Code     ReleaseCode
	User     string
	Quantity int
	Home     int
	ExpiryMs int64 // the reservation's: with its shard, it names its home pointer
}

// Release gives a reserved reservation's units back, once.
func (s *Store) Release(ctx context.Context, shard int, key string) (ReleaseResult, error) {
	return s.release(ctx, releaseScript, shard, key)
}

// ReleaseFromLedger is Release for a reservation whose hash is gone (it
// outlived the hash's backstop TTL): the ledger row's quantity, expiry and user
// say what to give back, and its expiry-index entry, if still there with that
// expiry, that it was never given back. qty 0 (no ledger row) only drops the
// index entry.
func (s *Store) ReleaseFromLedger(ctx context.Context, shard int, key string, qty int, expiryMs int64, user string) (ReleaseResult, error) {
	return s.release(ctx, releaseScript, shard, key, qty, expiryMs, user, HomeShard(user, len(s.shards)))
}

// Cancel is Release for the reservation's own user only.
func (s *Store) Cancel(ctx context.Context, shard int, key, user string) (ReleaseResult, error) {
	return s.release(ctx, cancelScript, shard, key, user)
}

func (s *Store) release(ctx context.Context, script script, shard int, key string, extra ...any) (ReleaseResult, error) {
	k := s.shards[shard]
	args := append([]any{key, shard}, extra...)
	v, err := script.Run(ctx, s.rdb, []string{k.Stock(), k.Meta(), k.Index(), k.Res(key), k.Users()}, args...).Slice()
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("release on shard %d: %w", shard, err)
	}
	if len(v) != 5 {
		return ReleaseResult{}, fmt.Errorf("release on shard %d: unexpected reply %v", shard, v)
	}
	return ReleaseResult{Code: ReleaseCode(toInt(v[0])), User: toString(v[1]), Quantity: int(toInt(v[2])), Home: int(toInt(v[3])), ExpiryMs: toInt(v[4])}, nil
}

// Quota operations on the home shard, for reservations placed on other shards.
const (
	// QuotaRelease: the placed reservation named by shard and expiry was
	// released: its quota goes back.
	QuotaRelease = "release"
	// QuotaForget: the placed reservation named by shard and expiry was sold:
	// the quota stays, its pointer and claims entry go.
	QuotaForget  = "forget"
	quotaConfirm = "confirm" // ConfirmClaim
	quotaUnclaim = "unclaim" // Unclaim
	quotaReap    = "reap"    // ReapClaim
)

// Quota runs quota.lua's release or forget on the user's home shard for the
// reservation of key placed on shard with expiryMs; any other pointer the key
// has there now is left alone. It reports whether it changed anything (false:
// already done, another placement's, or lost with the data).
func (s *Store) Quota(ctx context.Context, home int, op, user, key string, qty int, shard int, expiryMs int64) (bool, error) {
	if op != QuotaRelease && op != QuotaForget {
		return false, fmt.Errorf("quota on shard %d: unknown operation %q", home, op)
	}
	return s.quota(ctx, home, op, user, key, qty, Pointer(shard, expiryMs), "")
}

func (s *Store) quota(ctx context.Context, home int, op, user, key string, qty int, ptr, claim string) (bool, error) {
	k := s.shards[home]
	n, err := quotaScript.Run(ctx, s.rdb, []string{k.Users(), k.Claims()}, op, user, key, qty, ptr, claim).Int()
	if err != nil {
		return false, fmt.Errorf("quota %s on shard %d: %w", op, home, err)
	}
	return n == 1, nil
}

// ConfirmClaim turns the claim of key on the home shard into the pointer of
// the reservation placed on shard with expiryMs, if the claim is still the one
// claim names (the Status of the reserve script's CLAIMED answer).
func (s *Store) ConfirmClaim(ctx context.Context, home int, key, claim string, shard int, expiryMs int64) (bool, error) {
	return s.quota(ctx, home, quotaConfirm, "", key, 0, Pointer(shard, expiryMs), claim)
}

// Unclaim gives back the claim of key on the home shard if it is still the
// one claim names: no shard had stock for it.
func (s *Store) Unclaim(ctx context.Context, home int, key, claim string) (bool, error) {
	return s.quota(ctx, home, quotaUnclaim, "", key, 0, "", claim)
}

// StaleClaims lists up to limit keys of claims made on shard at or before
// cutoff: quota claimed for stealing whose placing process may have died.
func (s *Store) StaleClaims(ctx context.Context, shard int, cutoff time.Time, limit int) ([]string, error) {
	keys, err := s.rdb.ZRangeByScore(ctx, s.shards[shard].Claims(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(cutoff.UnixMilli(), 10), Count: int64(limit),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("claims of shard %d: %w", shard, err)
	}
	return keys, nil
}

// ReapClaim gives back the quota of the claim of key on shard when it was made
// at or before cutoff and is still a claim (its reservation was never confirmed
// placed), and reports whether it did. A claim given back meanwhile only leaves
// the claims index. For a claim whose reservation was confirmed placed it
// changes nothing and returns the reservation's shard: the caller asks the
// ledger whether to give the quota back (QuotaRelease) or keep it (QuotaForget).
func (s *Store) ReapClaim(ctx context.Context, shard int, key string, cutoff time.Time) (reaped bool, placedOn int, err error) {
	reaped, placedOn, _, err = s.ReapClaimAt(ctx, shard, key, cutoff)
	return reaped, placedOn, err
}

// ReapClaimAt is ReapClaim that also returns the expiry of a placed
// reservation: with placedOn, it names the pointer for Quota.
func (s *Store) ReapClaimAt(ctx context.Context, shard int, key string, cutoff time.Time) (reaped bool, placedOn int, expiryMs int64, err error) {
	k := s.shards[shard]
	v, err := quotaScript.Run(ctx, s.rdb, []string{k.Users(), k.Claims()}, quotaReap, "", key, 0, cutoff.UnixMilli(), "").Slice()
	if err != nil {
		return false, -1, 0, fmt.Errorf("reap claim on shard %d: %w", shard, err)
	}
	if len(v) != 2 {
		return false, -1, 0, fmt.Errorf("reap claim on shard %d: unexpected reply %v", shard, v)
	}
	if toInt(v[0]) != 2 {
		return toInt(v[0]) == 1, -1, 0, nil
	}
	target, expiry, _ := strings.Cut(toString(v[1]), "|")
	t, err := strconv.Atoi(target)
	if err != nil || t < 0 || t >= len(s.shards) {
		return false, -1, 0, fmt.Errorf("reap claim on shard %d: malformed pointer %q", shard, v[1])
	}
	return false, t, atoi64(expiry), nil
}

// MarkCommitted marks a reservation committed and takes it out of the expiry index.
// It returns 1 (marked), 2 (already committed), 0 (no such reservation) or
// CommitLedgerNeeded (its hash is gone, its index entry is not: call
// MarkCommittedFromLedger).
func (s *Store) MarkCommitted(ctx context.Context, shard int, key string) (int, error) {
	return s.markCommitted(ctx, shard, key)
}

// CommitLedgerNeeded is MarkCommitted's answer for a reservation whose hash
// is gone while its expiry-index entry still counts its units as reserved.
const CommitLedgerNeeded = 4

// MarkCommittedFromLedger is MarkCommitted for a reservation whose hash is
// gone: the ledger row's quantity and expiry take its units off the shard's
// reserved count, once (the index entry goes with them). It returns 3 when it
// did, 0 when there was nothing to do.
func (s *Store) MarkCommittedFromLedger(ctx context.Context, shard int, key string, qty int, expiryMs int64) (int, error) {
	return s.markCommitted(ctx, shard, key, qty, expiryMs)
}

func (s *Store) markCommitted(ctx context.Context, shard int, key string, ledgerRow ...any) (int, error) {
	k := s.shards[shard]
	n, err := commitScript.Run(ctx, s.rdb, []string{k.Meta(), k.Index(), k.Res(key)}, append([]any{key}, ledgerRow...)...).Int()
	if err != nil {
		return 0, fmt.Errorf("commit mark on shard %d: %w", shard, err)
	}
	return n, nil
}

// Seed writes a shard's first stock and meta; it never touches a live shard and
// reports whether it seeded.
func (s *Store) Seed(ctx context.Context, shard int, units, epoch int64, state string, lastChange int64) (bool, error) {
	k := s.shards[shard]
	n, err := seedScript.Run(ctx, s.rdb, []string{k.Stock(), k.Meta()}, units, epoch, state, lastChange).Int()
	if err != nil {
		return false, fmt.Errorf("seed shard %d: %w", shard, err)
	}
	return n == 1, nil
}

// Gate outcomes per shard.
const (
	GateSet        = 1
	GateNoMeta     = 0
	GateStale      = -1
	GateRebuilding = -2
)

// ErrBadState is returned for a gate state the scripts do not know.
var ErrBadState = errors.New("unknown gate state")

// SetGate writes the gate state of every shard and returns the per-shard outcome
// (GateSet, GateNoMeta, GateStale, GateRebuilding). epoch 0 accepts any epoch.
// Opening goes shard by shard and stops at the first that fails. Closing
// writes every shard at once, so that on a Redis Cluster a master that is
// down or hangs holds up only its own shards; the error names the first few
// shards that failed and counts the rest.
func (s *Store) SetGate(ctx context.Context, state string, epoch int64) ([]int, error) {
	return s.setGate(ctx, state, epoch, "")
}

// CloseOpen is SetGate of a closing state on the shards that are OPEN only:
// shards closed otherwise (failed closed) keep their state.
func (s *Store) CloseOpen(ctx context.Context, state string) ([]int, error) {
	if state == StateOpen {
		return nil, fmt.Errorf("%w: CloseOpen with %q", ErrBadState, state)
	}
	return s.setGate(ctx, state, 0, StateOpen)
}

func (s *Store) setGate(ctx context.Context, state string, epoch int64, from string) ([]int, error) {
	switch state {
	case StateOpen, StateNotStarted, StatePaused, StateEnded, StateFailClosed:
	default:
		return nil, fmt.Errorf("%w: %q", ErrBadState, state)
	}
	out := make([]int, len(s.shards))
	gate := func(i int) error {
		n, err := gateScript.Run(ctx, s.rdb, []string{s.shards[i].Meta()}, state, epoch, from).Int()
		if err != nil {
			return fmt.Errorf("gate shard %d: %w", i, err)
		}
		out[i] = n
		return nil
	}
	if state == StateOpen {
		for i := range s.shards {
			if err := gate(i); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	errs := make([]error, len(s.shards))
	var wg sync.WaitGroup
	for i := range s.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = gate(i)
		}()
	}
	wg.Wait()
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	// A short error: it ends up in the sale's conditions.
	const shown = 4
	switch {
	case len(failed) == 0:
		return out, nil
	case len(failed) > shown:
		return nil, fmt.Errorf("%w (and %d more shards)", errors.Join(failed[:shown]...), len(failed)-shown)
	}
	return nil, errors.Join(failed...)
}

// ErrRebuilt refuses an allocation change on a shard that is being rebuilt,
// or was rebuilt at another epoch than the ledger's the caller read: the
// rebuild writes the shard from its own snapshot of the ledger.
var ErrRebuilt = errors.New("the shard is being rebuilt, or was rebuilt since the ledger was read")

// Adjust applies one recorded allocation change to a shard exactly once: 1 applied,
// 0 already applied, -1 no meta. For an increase stockDelta = allocDelta > 0; for a
// decrease stockDelta = 0, allocDelta < 0 and settled = -allocDelta withdrawn units.
// epoch is the ledger's epoch the caller read (0: any); see ErrRebuilt.
func (s *Store) Adjust(ctx context.Context, shard int, epoch, changeID, allocDelta, stockDelta, settled int64) (int, error) {
	k := s.shards[shard]
	n, err := adjustScript.Run(ctx, s.rdb, []string{k.Stock(), k.Meta()}, changeID, allocDelta, stockDelta, settled, epoch).Int()
	if err != nil {
		return 0, fmt.Errorf("adjust shard %d: %w", shard, err)
	}
	if n == -2 {
		return 0, fmt.Errorf("adjust shard %d: %w", shard, ErrRebuilt)
	}
	return n, nil
}

// Withdraw moves up to units out of a shard's stock (units < 0: gives withdrawn
// units back) for an allocation decrease. It returns the units moved and the
// shard's withdrawn total; total -1 means the shard has no meta. epoch is the
// ledger's epoch the caller read (0: any); see ErrRebuilt.
func (s *Store) Withdraw(ctx context.Context, shard int, epoch, units int64) (moved, total int64, err error) {
	k := s.shards[shard]
	v, err := withdrawScript.Run(ctx, s.rdb, []string{k.Stock(), k.Meta()}, units, epoch).Int64Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("withdraw on shard %d: %w", shard, err)
	}
	if len(v) != 2 {
		return 0, 0, fmt.Errorf("withdraw on shard %d: unexpected reply %v", shard, v)
	}
	if v[1] == -2 {
		return 0, 0, fmt.Errorf("withdraw on shard %d: %w", shard, ErrRebuilt)
	}
	return v[0], v[1], nil
}

// Expired lists up to limit reservation keys of a shard whose expiry is at or before
// beforeMs (Redis clock).
func (s *Store) Expired(ctx context.Context, shard int, beforeMs int64, limit int) ([]string, error) {
	return s.rdb.ZRangeByScore(ctx, s.shards[shard].Index(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(beforeMs, 10), Count: int64(limit),
	}).Result()
}

// The states of a reservation hash.
const (
	ResReserved  = "R"
	ResCommitted = "C"
)

// Reservation is a reservation hash as stored in Redis.
type Reservation struct {
	Key      string
	Shard    int
	User     string
	Quantity int
	Status   string // ResReserved or ResCommitted
	ExpiryMs int64
	Epoch    int64
	Home     int
	// CreatedMs is when a committed reservation was made (RebuildRestore:
	// its hash lives the backstop TTL from then, as it would have).
	CreatedMs int64
}

// GetReservation reads a reservation hash; ok is false when it does not exist.
func (s *Store) GetReservation(ctx context.Context, shard int, key string) (Reservation, bool, error) {
	m, err := s.rdb.HGetAll(ctx, s.shards[shard].Res(key)).Result()
	if err != nil {
		return Reservation{}, false, err
	}
	if len(m) == 0 {
		return Reservation{}, false, nil
	}
	return Reservation{
		Key: key, Shard: shard, User: m["u"], Status: m["s"],
		Quantity: atoi(m["q"]), ExpiryMs: atoi64(m["e"]), Epoch: atoi64(m["p"]), Home: atoi(m["h"]),
	}, true, nil
}

// Now is the Redis server's clock, the one expiries are measured with.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	return s.rdb.Time(ctx).Result()
}

// ShardState is what a shard holds right now.
type ShardState struct {
	Index      int
	Present    bool // the meta exists; false after Redis lost its data
	State      string
	Epoch      int64
	Available  int64 // stock
	Reserved   int64 // units in RESERVED reservations
	Allocation int64 // units given to this shard (seed + changes)
	LastChange int64
	Withdrawn  int64  // units taken out of stock for an allocation decrease not yet settled
	Server     string // run id of the server the shard was seeded or rebuilt on ("": not recorded)
	// Unverified: the meta names another server process than the one holding
	// the shard now (its run id read by State), so the reserve script refuses
	// it (see reserve.lua). A meta that records no server is never unverified.
	Unverified bool
}

// State reads every shard's stock and meta in one pipeline, then the run id of
// each server holding a meta that records one (one INFO per server): cheap
// enough to run every few seconds during a storm.
func (s *Store) State(ctx context.Context) ([]ShardState, error) {
	pipe := s.rdb.Pipeline()
	stocks := make([]*redis.StringCmd, len(s.shards))
	metas := make([]*redis.SliceCmd, len(s.shards))
	for i, k := range s.shards {
		stocks[i] = pipe.Get(ctx, k.Stock())
		metas[i] = pipe.HMGet(ctx, k.Meta(), "state", "epoch", "rsv", "alloc", "chg", "wd", "srv")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make([]ShardState, len(s.shards))
	for i := range s.shards {
		st := ShardState{Index: i}
		if v, err := stocks[i].Int64(); err == nil {
			st.Available = v
		}
		m := metas[i].Val()
		if len(m) == 7 && m[0] != nil {
			st.Present = true
			st.State = toString(m[0])
			st.Epoch = atoi64(toString(m[1]))
			st.Reserved = atoi64(toString(m[2]))
			st.Allocation = atoi64(toString(m[3]))
			st.LastChange = atoi64(toString(m[4]))
			st.Withdrawn = atoi64(toString(m[5]))
			st.Server = toString(m[6])
		}
		out[i] = st
	}
	return out, s.verifyServers(ctx, out)
}

// verifyServers sets Unverified on the states whose meta records another
// server process than the one holding the shard now. Each server's run id is
// read once, now: the reserve path's cached ids would miss a restart that no
// reserve call has run into yet.
func (s *Store) verifyServers(ctx context.Context, states []ShardState) error {
	now := map[string]string{} // address -> run id
	for i := range states {
		st := &states[i]
		if st.Server == "" {
			continue
		}
		node, err := s.node(ctx, s.shards[st.Index].Meta())
		if err != nil {
			return err
		}
		addr := node.Options().Addr
		id, ok := now[addr]
		if !ok {
			if id, err = runID(ctx, node); err != nil {
				return err
			}
			now[addr] = id
		}
		st.Unverified = st.Server != id
	}
	return nil
}

// shardServers returns the servers holding the campaign's shards, each once: in a
// cluster, the masters of their slots by the client's slot map.
func (s *Store) shardServers(ctx context.Context) ([]*redis.Client, error) {
	var out []*redis.Client
	seen := map[string]bool{}
	for _, k := range s.shards {
		node, err := s.node(ctx, k.Meta())
		if err != nil {
			return nil, err
		}
		if addr := node.Options().Addr; !seen[addr] {
			seen[addr] = true
			out = append(out, node)
		}
	}
	return out, nil
}

// Ping checks that every server holding the campaign's shards answers. A
// keyless PING through a cluster client goes to a master of its slot map,
// which a reload during a whole-cluster restart can leave empty until its next
// refresh, and then fails; going by key, an empty map sends each ping to a
// known node instead, and the first command that meets a moved slot reloads
// the map.
func (s *Store) Ping(ctx context.Context) error {
	nodes, err := s.shardServers(ctx)
	if err != nil {
		return err
	}
	for _, node := range nodes {
		if err := node.Ping(ctx).Err(); err != nil {
			s.redirected(ctx, err)
			return fmt.Errorf("%s: %w", node.Options().Addr, err)
		}
	}
	return nil
}

// RunIDs returns the run_id of every Redis server holding shards of the
// campaign, keyed by address: in a cluster, the masters that own the slots of
// the shards, not every master, so that a restart or a new master elsewhere in
// a shared cluster does not read as this sale's data loss. A changed run_id
// means the server restarted and may have lost its data; a shard whose slot
// moves to another server shows up as a new address.
func (s *Store) RunIDs(ctx context.Context) (map[string]string, error) {
	srv, err := s.Servers(ctx)
	return srv.RunIDs, err
}

// ServerCheck is what one INFO of each server holding shards says.
type ServerCheck struct {
	RunIDs map[string]string // by address
	// Evicting is ErrEvictionPolicy naming the servers that may evict keys,
	// or nil.
	Evicting error
}

// Servers reads the servers holding the sale's shards, one INFO (server and
// memory) each: RunIDs and CheckEviction in one round trip per server, for a
// caller that needs both at every refresh.
func (s *Store) Servers(ctx context.Context) (ServerCheck, error) {
	if c, ok := s.rdb.(*redis.ClusterClient); ok {
		// ForEachMaster reloads the slot map first (MasterForKey alone uses
		// the cached one): a failover must show as the new master at once.
		if err := c.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }); err != nil {
			return ServerCheck{}, err
		}
	}
	nodes, err := s.shardServers(ctx)
	if err != nil {
		return ServerCheck{}, err
	}
	out := ServerCheck{RunIDs: make(map[string]string, len(nodes))}
	var evicting []string
	for _, node := range nodes {
		addr := node.Options().Addr
		info, err := node.Info(ctx, "server", "memory").Result()
		if err != nil {
			// A server before 7.0 refuses two sections: INFO server alone
			// names it (ErrRedisTooOld).
			if _, verr := runID(ctx, node); verr != nil {
				return out, verr
			}
			return out, err
		}
		id, err := runIDFrom(addr, info)
		if err != nil {
			return out, err
		}
		out.RunIDs[addr] = id
		policy, max := infoField(info, "maxmemory_policy"), infoField(info, "maxmemory")
		switch {
		case policy == "" || max == "":
			evicting = append(evicting, fmt.Sprintf("%s (INFO memory does not say its maxmemory and maxmemory-policy)", addr))
		case policy != "noeviction" && max != "0":
			evicting = append(evicting, fmt.Sprintf("%s (maxmemory %s, maxmemory-policy %s)", addr, max, policy))
		}
	}
	if len(evicting) > 0 {
		slices.Sort(evicting)
		out.Evicting = fmt.Errorf("%w: %s", ErrEvictionPolicy, strings.Join(evicting, ", "))
	}
	return out, nil
}

// ErrEvictionPolicy: a server holding shards may evict keys under memory
// pressure (maxmemory set, maxmemory-policy other than noeviction). An evicted
// reservation hash loses its unit, an evicted users hash lifts the per-user
// limit, an evicted stock key shows a shard sold out.
var ErrEvictionPolicy = errors.New("a Redis server holding shards may evict keys: set maxmemory-policy noeviction (or no maxmemory)")

// CheckEviction refuses servers holding shards that may evict keys
// (ErrEvictionPolicy, naming them and their policy).
func (s *Store) CheckEviction(ctx context.Context) error {
	srv, err := s.Servers(ctx)
	if err != nil {
		return err
	}
	return srv.Evicting
}

// DeleteAll removes every key of the campaign (all shards), for a deleted FlashSale.
func (s *Store) DeleteAll(ctx context.Context) (int, error) {
	var (
		mu      sync.Mutex // ForEachMaster calls in parallel
		deleted int
	)
	// A page of SCAN at a time, its keys unlinked in one pipeline: the server
	// may hold many other keys (a shared Redis), and the sale's committed
	// reservation hashes, one per unit sold.
	scan := func(ctx context.Context, c *redis.Client) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, campaignPattern(s.campaign), 1000).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				// One key per UNLINK: keys of different shards live in
				// different slots (all on this server).
				pipe := c.Pipeline()
				for _, k := range keys {
					pipe.Unlink(ctx, k)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					return err
				}
				mu.Lock()
				deleted += len(keys)
				mu.Unlock()
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		err := c.ForEachMaster(ctx, scan)
		return deleted, err
	case *redis.Client:
		return deleted, scan(ctx, c)
	default:
		return 0, fmt.Errorf("unsupported redis client %T", s.rdb)
	}
}

func checkVersion(addr, version string) error {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	switch {
	case err != nil:
		return fmt.Errorf("%s: INFO server gives no redis_version (%q)", addr, version)
	case n < 7:
		return fmt.Errorf("%w: %s runs %s", ErrRedisTooOld, addr, version)
	}
	return nil
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		return atoi64(x)
	}
	return 0
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func atoi64(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }

// RebuildBegin closes shard n for a rebuild under the new epoch and wipes it.
func (s *Store) RebuildBegin(ctx context.Context, n int, epoch int64) error {
	k := s.shards[n]
	keys := []string{k.Stock(), k.Meta(), k.Index(), k.Users(), k.Claims()}
	for {
		left, err := rebuildBeginScript.Run(ctx, s.rdb, keys, epoch, k.ResPrefix(), rebuildWipeBatch).Int64()
		if err != nil || left == 0 {
			return err
		}
	}
}

// rebuildWipeBatch bounds the reservations one rebuild_begin call deletes.
const rebuildWipeBatch = 1000

// RebuildRestore recreates reservations on shard n, being rebuilt under epoch:
// pending ones (ResReserved) and committed ones (ResCommitted). A committed one
// whose hash would have outlived the backstop TTL since CreatedMs is skipped.
func (s *Store) RebuildRestore(ctx context.Context, n int, epoch int64, rs []Reservation) error {
	k := s.shards[n]
	now := time.Now().UnixMilli()
	keys := []string{k.Meta(), k.Index()}
	args := []any{epoch}
	restored := 0
	for _, r := range rs {
		// A reservation made under a longer TTL than the campaign's current one
		// still holds its unit until its own expiry: its hash must outlive that.
		ttl := s.backstop
		if left := time.Duration(r.ExpiryMs-now) * time.Millisecond; left > 0 {
			ttl = max(ttl, addCapped(s.backstop, left))
		}
		if r.Status == ResCommitted {
			ttl = s.backstop - time.Duration(now-r.CreatedMs)*time.Millisecond
			if ttl < time.Second {
				continue
			}
		} else if r.Status != ResReserved {
			return fmt.Errorf("restore on shard %d: reservation %s has status %q", n, r.Key, r.Status)
		}
		keys = append(keys, k.Res(r.Key))
		args = append(args, r.Key, r.User, r.Quantity, r.ExpiryMs, r.Epoch, r.Home, r.Status, int64(ttl/time.Second))
		restored++
	}
	if restored == 0 {
		return nil
	}
	got, err := rebuildRestoreScript.Run(ctx, s.rdb, keys, args...).Int()
	if err == nil && got != restored {
		err = fmt.Errorf("restore on shard %d: shard is not being rebuilt under epoch %d", n, epoch)
	}
	return err
}

// RebuildUsers restores users-hash fields (field, value pairs) on shard n,
// being rebuilt under epoch.
func (s *Store) RebuildUsers(ctx context.Context, n int, epoch int64, fields []string) error {
	if len(fields) == 0 {
		return nil
	}
	k := s.shards[n]
	args := make([]any, 0, 1+len(fields))
	args = append(args, epoch)
	for _, f := range fields {
		args = append(args, f)
	}
	got, err := rebuildUsersScript.Run(ctx, s.rdb, []string{k.Meta(), k.Users(), k.Claims()}, args...).Int()
	if err == nil && got < 0 {
		err = fmt.Errorf("restore users on shard %d: shard is not being rebuilt under epoch %d", n, epoch)
	}
	return err
}

// RebuildFinish writes the stock and then the meta (gate state) of shard n.
func (s *Store) RebuildFinish(ctx context.Context, n int, units, epoch int64, gate string, alloc, lastChange int64) error {
	k := s.shards[n]
	got, err := rebuildFinishScript.Run(ctx, s.rdb, []string{k.Stock(), k.Meta()}, units, epoch, gate, alloc, lastChange).Int()
	if err == nil && got != 1 {
		err = fmt.Errorf("finish shard %d: shard is not being rebuilt under epoch %d", n, epoch)
	}
	return err
}
