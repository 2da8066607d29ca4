// Package engine is the reservation engine of one flash sale: it combines the Redis
// shards (package stock) with the PostgreSQL ledger (package ledger) into reserve,
// checkout, cancel, the sweeper pass, seeding, restock and the fail-closed rebuild.
// The reservation API, the sweeper and the controller all call it.
package engine

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Config describes one campaign (one FlashSale).
type Config struct {
	CampaignID  string // the FlashSale UID
	Namespace   string
	Name        string
	SKU         string
	Allocation  int64 // used when the campaign row is first created
	Shards      int
	MaxPerUser  int
	TTL         time.Duration // reservation lifetime
	Grace       time.Duration // extra time before the sweeper releases
	StealProbes int           // 0..2 other shards tried when the home shard is sold out
	// IDSecret keys the reservation ids: required to reserve. An engine without
	// one (the sweeper's) sweeps, counts, checks out and cancels.
	IDSecret []byte
	// ClaimSlack: a quota claim for stealing whose reservation was never
	// confirmed placed (the process placing it died) is given back by Sweep once
	// it is TTL + Grace + ClaimSlack old, when any reservation placed under it
	// has expired. ClaimSlack covers the placing itself; default one minute.
	ClaimSlack time.Duration
	// SettleStuckAfter: a request replayed while its reservation has no ledger
	// row, seen so by this engine for this long, is settled (see Reserve);
	// default 30 s, far above a request's deadline and a ledger batch's timeout.
	SettleStuckAfter time.Duration
	// LedgerStallAfter: while a ledger batch has been out this long, new
	// reservations are refused (ErrUnavailable) before they take any unit;
	// default 2 s. After a write failed, they are refused until the ledger
	// answers again (asked every 250 ms). A unit taken for a row the ledger
	// cannot write is held until the write fails, and meanwhile other buyers
	// are told SOLD_OUT, which they do not retry.
	LedgerStallAfter time.Duration
	// Backstop is how long a paid reservation's Redis hash is kept from its
	// commit mark (it answers the request's retries); default
	// stock.BackstopFor(TTL + Grace). A held reservation's hash has no TTL.
	Backstop time.Duration
	// Pipeline batches concurrent reserve script calls to one Redis server
	// into pipelines (stock.PipelineConfig); zero: every call on its own.
	Pipeline stock.PipelineConfig
	// Rand draws the shards a steal probes; nil: a source seeded from
	// crypto/rand. The engine uses it under its own lock, so one source
	// serves one engine. A test passes a seeded one to replay its schedule.
	Rand rand.Source
}

// DefaultLedgerStallAfter is Config.LedgerStallAfter's default.
const DefaultLedgerStallAfter = 2 * time.Second

// DefaultClaimSlack is Config.ClaimSlack's default.
const DefaultClaimSlack = time.Minute

// DefaultSettleStuckAfter is Config.SettleStuckAfter's default.
const DefaultSettleStuckAfter = 30 * time.Second

// Validate reports the first problem with a Config.
func (c Config) Validate() error {
	switch {
	case c.CampaignID == "":
		return errors.New("campaign id is required")
	case c.Shards < 1 || c.Shards > 1024:
		return fmt.Errorf("shards must be 1..1024, got %d", c.Shards)
	case c.MaxPerUser < 1:
		return fmt.Errorf("maxPerUser must be at least 1, got %d", c.MaxPerUser)
	case c.TTL <= 0:
		return fmt.Errorf("ttl must be positive, got %s", c.TTL)
	case c.Grace < 0:
		return fmt.Errorf("grace period must not be negative, got %s", c.Grace)
	case c.ClaimSlack < 0:
		return fmt.Errorf("claim slack must not be negative, got %s", c.ClaimSlack)
	case c.SettleStuckAfter < 0:
		return fmt.Errorf("the stuck-replay delay must not be negative, got %s", c.SettleStuckAfter)
	case c.Backstop < 0:
		return fmt.Errorf("the reservation hash backstop must not be negative, got %s", c.Backstop)
	case c.LedgerStallAfter < 0:
		return fmt.Errorf("the ledger stall delay must not be negative, got %s", c.LedgerStallAfter)
	case c.StealProbes < 0 || c.StealProbes > 2:
		return fmt.Errorf("stealProbes must be 0..2, got %d", c.StealProbes)
	case len(c.IDSecret) > 0 && len(c.IDSecret) < 16:
		return errors.New("the reservation id secret must be at least 16 bytes")
	}
	return c.Pipeline.Validate()
}

// soldOutMemory is how long a shard seen sold out is skipped by stealing. Releases
// may refill it; a short memory only costs a brief undersell, never an oversell.
const soldOutMemory = 250 * time.Millisecond

// Engine runs one campaign. It is safe for concurrent use.
type Engine struct {
	cfg      Config
	store    *stock.Store
	ledger   *ledger.Ledger
	mat      *ledger.Materializer
	soldOut  []atomic.Int64 // unix nanos until which a shard is taken as sold out
	minEpoch atomic.Int64   // highest epoch seen: shards with an older meta are stale
	stuck    stuckReplays   // replays found without a ledger row, and since when
	// ledgerFailing: a ledger write failed and no writer's probe has passed
	// since (see ledgerWrote).
	ledgerFailing atomic.Bool
	ownsLedger    bool          // opened by Dial: Close closes it
	closing       chan struct{} // closed by Close
	later         laterMarks    // Redis marks to try again (marks_later.go)
	steps         chan struct{} // Redis steps going on by themselves (redisStep)
	closeOnce     sync.Once
	now           func() time.Time

	rngMu sync.Mutex
	rng   *rand.Rand // Config.Rand, under rngMu

	// attemptBase and attempts tag each reserve attempt (stock.ReserveRequest.Attempt):
	// random per engine, so that attempts of one request made by different
	// processes differ too.
	attemptBase string
	attempts    atomic.Uint64

	keys *stock.Keyer // reservation keys, with cfg.IDSecret

	// countsBetweenReads, set by tests only, runs in Counts between its
	// ledger read and its Redis read.
	countsBetweenReads func()
	// sweepBudget (0: sweepShardBatches) and sweptBatch, set by tests only:
	// a pass's batches per shard, and a call after each batch.
	sweepBudget int
	sweptBatch  func()
}

// New builds an engine on a Redis client (standalone or cluster) and an open ledger.
func New(cfg Config, rdb redis.UniversalClient, l *ledger.Ledger, mc ledger.MaterializerConfig) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ClaimSlack == 0 {
		cfg.ClaimSlack = DefaultClaimSlack
	}
	if cfg.SettleStuckAfter == 0 {
		cfg.SettleStuckAfter = DefaultSettleStuckAfter
	}
	if cfg.LedgerStallAfter == 0 {
		cfg.LedgerStallAfter = DefaultLedgerStallAfter
	}
	if cfg.Backstop == 0 {
		cfg.Backstop = stock.BackstopFor(cfg.TTL + cfg.Grace)
	}

	var seed [38]byte // a ChaCha8 key, then the attempt tags' base
	if _, err := crand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("seeding the engine: %w", err)
	}
	src := cfg.Rand
	if src == nil {
		src = rand.NewChaCha8([32]byte(seed[:32]))
	}
	return &Engine{
		cfg:         cfg,
		store:       stock.New(rdb, cfg.CampaignID, cfg.Shards).WithBackstop(cfg.Backstop).WithPipeline(cfg.Pipeline),
		keys:        stock.NewKeyer(cfg.IDSecret),
		ledger:      l,
		mat:         l.NewMaterializer(mc),
		soldOut:     make([]atomic.Int64, cfg.Shards),
		closing:     make(chan struct{}),
		steps:       make(chan struct{}, redisStepsMax),
		now:         time.Now,
		rng:         rand.New(src),
		attemptBase: hex.EncodeToString(seed[32:]),
	}, nil
}

// newAttempt is a tag no other attempt of this engine has, and no other
// engine's but by a 2^-48 chance.
func (e *Engine) newAttempt() string {
	return e.attemptBase + strconv.FormatUint(e.attempts.Add(1), 36)
}

// Close flushes the materializer, and closes the ledger if Dial opened it.
func (e *Engine) Close() {
	e.closeOnce.Do(func() { close(e.closing) })
	e.mat.Close()
	if e.ownsLedger {
		e.ledger.Close()
	}
}

// Config returns the campaign configuration.
func (e *Engine) Config() Config { return e.cfg }

// cleanupTimeout bounds the work done after a caller gave up (releasing a unit).
const cleanupTimeout = 5 * time.Second

// detached keeps a cleanup going when the request's context is cancelled: a unit
// taken must be given back even if the client went away.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// markSoldOut remembers a shard that could not give quantity units. Only a
// shard short of one unit is empty: one short of two may hold the last unit,
// which a buyer of one, skipping it, would be told was sold.
func (e *Engine) markSoldOut(shard, quantity int) {
	if quantity == 1 {
		e.soldOut[shard].Store(e.now().Add(soldOutMemory).UnixNano())
	}
}

func (e *Engine) knownSoldOut(shard int) bool {
	return e.now().UnixNano() < e.soldOut[shard].Load()
}

func (e *Engine) seeEpoch(epoch int64) {
	for {
		cur := e.minEpoch.Load()
		if epoch <= cur || e.minEpoch.CompareAndSwap(cur, epoch) {
			return
		}
	}
}

// stealOrder picks up to StealProbes random shards other than home, skipping those
// seen sold out a moment ago.
func (e *Engine) stealOrder(home int) []int {
	out := make([]int, 0, e.cfg.StealProbes)
	e.rngMu.Lock()
	perm := e.rng.Perm(e.cfg.Shards)
	e.rngMu.Unlock()
	for _, s := range perm {
		if len(out) == e.cfg.StealProbes {
			break
		}
		if s != home && !e.knownSoldOut(s) {
			out = append(out, s)
		}
	}
	return out
}

// ErrLedger marks failures talking to PostgreSQL, as opposed to Redis, so callers
// can say which one is down.
var ErrLedger = errors.New("ledger")

type ledgerError struct {
	op  string
	err error
}

func (e *ledgerError) Error() string   { return "ledger " + e.op + ": " + e.err.Error() }
func (e *ledgerError) Unwrap() []error { return []error{ErrLedger, e.err} }

func ledgerFailure(op string, err error) error { return &ledgerError{op, err} }

// ledgerRefuses reports whether a reservation now would take a unit the
// ledger may not record: while a batch hangs (Config.LedgerStallAfter), or
// after a write failed until the ledger answers again. Such a unit is held
// until the write fails, and meanwhile other buyers are told SOLD_OUT.
func (e *Engine) ledgerRefuses() bool {
	return e.ledgerFailing.Load() || e.mat.Stalled(e.cfg.LedgerStallAfter)
}

// ledgerPingEvery is how often a failing ledger is asked whether it answers.
const ledgerPingEvery = 250 * time.Millisecond

// ledgerWrote records the outcome of a ledger write. A failure other than
// the caller's own (it gave up before the row was sent), a fence (a
// rebuild), a duplicate or an engine closing makes the ledger failing, and
// starts asking it until it answers.
func (e *Engine) ledgerWrote(err error) {
	switch {
	case err == nil, errors.Is(err, ledger.ErrDuplicate), errors.Is(err, ledger.ErrNotSent),
		errors.Is(err, ledger.ErrFenced), errors.Is(err, ledger.ErrClosed):
		return
	}
	if e.ledgerFailing.CompareAndSwap(false, true) {
		go e.waitForLedger()
	}
}

// waitForLedger asks the ledger until a batch would be written now (a
// writer's probe: the server takes writes, no lock holds batches, a commit
// returns), then lets reservations through again; in the background, so
// that a sale sold out or ended while the ledger failed still gets its
// answers (no reservation would write). A ping would pass while every write
// is refused (a read-only server) or hangs (a table lock, a commit waiting
// for a lost synchronous standby), and each wave let through would take
// units only to give them back, or hold them until they expire.
func (e *Engine) waitForLedger() {
	tick := time.NewTicker(ledgerPingEvery)
	defer tick.Stop()
	for {
		select {
		case <-e.closing:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*ledgerPingEvery)
		err := e.mat.ProbeWrite(ctx, e.cfg.CampaignID)
		cancel()
		if err == nil {
			e.ledgerFailing.Store(false)
			return
		}
	}
}
