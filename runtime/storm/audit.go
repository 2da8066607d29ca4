package storm

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// Source is where the audit reads the campaign: Redis and the ledger.
type Source interface {
	Counts(ctx context.Context) (engine.Counts, error)
	// Statuses returns the ledger status of each id that has a row.
	Statuses(ctx context.Context, ids []string) (map[string]ledger.Status, error)
}

// Audit is the conservation audit after a storm.
type Audit struct {
	Allocation int64 `json:"allocation"`
	Available  int64 `json:"available"`
	Reserved   int64 `json:"reserved"` // Redis: units in live reservations
	Sold       int64 `json:"sold"`     // ledger: committed units
	Pending    int64 `json:"pending"`  // ledger: PENDING units
	Oversold   int64 `json:"oversold"`
	Conserved  bool  `json:"conserved"` // available + reserved + sold = allocation, in total and per shard
	// CheckedShards: every request was answered (none UNAVAILABLE), so Redis's
	// live reservations and the ledger's PENDING rows were compared per shard.
	CheckedShards bool `json:"checked_shards"`

	// Settled: reserved and ledger pending reached 0 (every reservation paid,
	// cancelled or swept) within the settle time. Only checked when asked.
	SettleAsked   bool    `json:"settle_asked"`
	Settled       bool    `json:"settled"`
	SettleSeconds float64 `json:"settle_seconds"`

	Acked              int `json:"acked"`
	AckedInLedger      int `json:"acked_in_ledger"` // rows in any status but ABANDONED
	Confirmed          int `json:"confirmed"`
	ConfirmedCommitted int `json:"confirmed_committed"`
	Cancelled          int `json:"cancelled"`
	CancelledByUser    int `json:"cancelled_by_user"`

	// Failures name every invariant that does not hold; empty means OK.
	Failures []string `json:"failures"`
	OK       bool     `json:"ok"`
}

// settlePoll is how often the audit looks while waiting for the sweeper.
const settlePoll = 200 * time.Millisecond

// maxExamples bounds the ids quoted in a failure.
const maxExamples = 5

// RunAudit waits up to settle for the campaign to quiesce (no reservation
// left in Redis or PENDING in the ledger), then checks:
//
//   - I1: nothing oversold, and no shard's stock holds a unit already sold
//     (exact at any moment, settled or not);
//   - I2: available + reserved + sold = allocation (exact once settled: a
//     checkout cut between its ledger commit and its Redis step counts its
//     unit as both reserved and sold until the sweeper settles it);
//   - I3: every acknowledged reservation has a ledger row that is not ABANDONED,
//     every confirmed checkout is COMMITTED, every acknowledged cancel is
//     CANCELLED_BY_USER;
//   - I4: every retry of an acknowledged request replayed it (Result's
//     IdempotencyViolations);
//   - every lost answer's reservation was in its buyer's list while held,
//     as answered (Result's ListViolations);
//   - I7: no checkout answered EXPIRED was sold.
func RunAudit(ctx context.Context, src Source, res *Result, settle time.Duration) (*Audit, error) {
	return RunAuditUntil(ctx, nil, src, res, settle)
}

// RunAuditUntil is RunAudit whose settle wait also ends when stop closes (an
// interrupt): the checks then run at once on what the campaign holds.
func RunAuditUntil(ctx context.Context, stop <-chan struct{}, src Source, res *Result, settle time.Duration) (*Audit, error) {
	start := time.Now()
	a := &Audit{SettleAsked: settle > 0}
	c, settled, err := awaitSettled(ctx, stop, src, settle)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	a.Settled = settled
	a.SettleSeconds = time.Since(start).Seconds()
	a.Allocation, a.Available, a.Reserved, a.Sold, a.Pending = c.Allocation, c.Available, c.Reserved, c.Sold, c.Pending
	a.Oversold, a.Conserved = c.Oversold(), c.Conserved()
	fail := a.fail

	if a.Oversold > 0 {
		fail("I1 oversold: %d units sold of an allocation of %d", a.Sold, a.Allocation)
	}
	if err := c.StockOversold(); err != nil {
		fail("I1: %v", err)
	}
	if !a.Conserved {
		fail("I2: available %d + reserved %d + sold %d != allocation %d", a.Available, a.Reserved, a.Sold, a.Allocation)
	}
	if a.SettleAsked && !a.Settled {
		fail("not settled after %s: %d units still reserved in Redis, %d pending in the ledger (is a sweeper running?)",
			settle, a.Reserved, a.Pending)
	}
	// When every request got an answer other than UNAVAILABLE, no reservation
	// was left between Redis and the ledger (a crashed replica, an ambiguous
	// commit): the two agree shard by shard. A unit released twice, or a row
	// written for a refused reservation, shows here.
	if a.CheckedShards = answeredCleanly(res); a.CheckedShards {
		apart, err := shardsApart(ctx, src, c)
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		for _, s := range apart {
			fail("I3/I6: shard %d holds %d units in live reservations in Redis and %d PENDING in the ledger", s.Index, s.Reserved, s.Pending)
		}
	}

	if err := a.checkRows(ctx, src, res); err != nil {
		return nil, err
	}
	if n := len(res.IdempotencyViolations); n > 0 {
		fail("I4: %d retries of acknowledged requests did not replay them (%s)", n, examples(res.IdempotencyViolations))
	}
	if n := len(res.ListViolations); n > 0 {
		fail("%d buyers' lists did not show a reservation held as it was answered (%s)", n, examples(res.ListViolations))
	}
	a.OK = len(a.Failures) == 0
	return a, nil
}

// awaitSettled reads the counts until nothing is reserved or pending and
// they add up, for at most settle, or until stop closes.
func awaitSettled(ctx context.Context, stop <-chan struct{}, src Source, settle time.Duration) (engine.Counts, bool, error) {
	deadline := time.Now().Add(settle)
	for {
		c, err := src.Counts(ctx)
		if err != nil {
			return c, false, err
		}
		if c.Reserved == 0 && c.Pending == 0 && c.Conserved() {
			return c, true, nil
		}
		if settle <= 0 || !time.Now().Before(deadline) {
			return c, false, nil
		}
		select {
		case <-ctx.Done():
			return c, false, ctx.Err()
		case <-stop:
			return c, false, nil // an interrupt: check what is there now
		case <-time.After(settlePoll):
		}
	}
}

func (a *Audit) fail(format string, args ...any) {
	a.Failures = append(a.Failures, fmt.Sprintf(format, args...))
}

// checkRows holds every answer the storm got against the ledger's rows
// (I3, I7).
func (a *Audit) checkRows(ctx context.Context, src Source, res *Result) error {
	fail := a.fail
	ids := make([]string, 0, len(res.Acked)+len(res.Confirmed)+len(res.Cancelled)+len(res.Voided))
	ids = append(append(append(append(ids, res.Acked...), res.Confirmed...), res.Cancelled...), res.Voided...)
	statuses, err := src.Statuses(ctx, ids)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	a.Acked, a.Confirmed, a.Cancelled = len(res.Acked), len(res.Confirmed), len(res.Cancelled)
	var missing, abandoned, notCommitted, notCancelled []string
	for _, id := range res.Acked {
		switch s, ok := statuses[id]; {
		case !ok:
			missing = append(missing, id)
		case s == ledger.StatusAbandoned:
			abandoned = append(abandoned, id)
		default:
			a.AckedInLedger++
		}
	}
	for _, id := range res.Confirmed {
		if statuses[id] == ledger.StatusCommitted {
			a.ConfirmedCommitted++
		} else {
			notCommitted = append(notCommitted, id+"="+orNone(statuses[id]))
		}
	}
	for _, id := range res.Cancelled {
		if statuses[id] == ledger.StatusCancelledByUser {
			a.CancelledByUser++
		} else {
			notCancelled = append(notCancelled, id+"="+orNone(statuses[id]))
		}
	}
	if len(missing) > 0 {
		fail("I3: %d acknowledged reservations have no ledger row (%s)", len(missing), examples(missing))
	}
	if len(abandoned) > 0 {
		fail("I3: %d acknowledged reservations were recorded ABANDONED (%s)", len(abandoned), examples(abandoned))
	}
	if len(notCommitted) > 0 {
		fail("I3: %d confirmed checkouts are not COMMITTED in the ledger (%s)", len(notCommitted), examples(notCommitted))
	}
	if len(notCancelled) > 0 {
		fail("I3: %d acknowledged cancels are not CANCELLED_BY_USER in the ledger (%s)", len(notCancelled), examples(notCancelled))
	}
	var soldAfterVoid []string
	for _, id := range res.Voided {
		if statuses[id] == ledger.StatusCommitted {
			soldAfterVoid = append(soldAfterVoid, id)
		}
	}
	if len(soldAfterVoid) > 0 {
		fail("I7: %d checkouts answered EXPIRED (void the payment) are COMMITTED in the ledger (%s)", len(soldAfterVoid), examples(soldAfterVoid))
	}
	return nil
}

// Counts reads Redis and then the ledger, and a sweeper or a cancel changes
// the ledger first and Redis after: one read may catch a unit between the
// two. A shard only counts as apart when it is in every one of
// shardRereads reads, shardReread apart.
const (
	shardRereads = 5
	shardReread  = 100 * time.Millisecond
)

// shardsApart returns the shards whose live reservations in Redis differ from
// their PENDING units in the ledger, starting from c and reading again while
// any differ.
func shardsApart(ctx context.Context, src Source, c engine.Counts) ([]engine.ShardCounts, error) {
	for read := 1; ; read++ {
		var apart []engine.ShardCounts
		for _, s := range c.Shards {
			if s.Reserved != s.Pending {
				apart = append(apart, s)
			}
		}
		if len(apart) == 0 || read == shardRereads {
			return apart, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(shardReread):
		}
		var err error
		if c, err = src.Counts(ctx); err != nil {
			return nil, err
		}
	}
}

// answeredCleanly reports whether every request got an HTTP answer and none
// was 503 UNAVAILABLE.
func answeredCleanly(res *Result) bool {
	for _, byOutcome := range res.Outcomes {
		for label, n := range byOutcome {
			if n > 0 && (strings.HasPrefix(label, "ERR") || label == "503 UNAVAILABLE") {
				return false
			}
		}
	}
	return true
}

func orNone(s ledger.Status) string {
	if s == "" {
		return "no row"
	}
	return string(s)
}

func examples(ids []string) string {
	if len(ids) <= maxExamples {
		return fmt.Sprint(ids)
	}
	return fmt.Sprintf("%v and %d more", ids[:maxExamples], len(ids)-maxExamples)
}

// sqlStatuses reads the status of reservations of one campaign, through the
// orders' primary key (campaign, request key) as the ledger's own lookups do
// (runtime/ledger byIDs2).
const sqlStatuses = `SELECT reservation_id, status FROM flashsale_orders
WHERE campaign_id = $1 AND request_key = ANY (ARRAY(SELECT k FROM unnest($2::text[]) AS i(id),
        LATERAL (VALUES (split_part(i.id, '.', 2)), ('.' || i.id)) AS v(k)))
  AND reservation_id = ANY ($2::text[])`

// statusBatch bounds the ids sent in one query.
const statusBatch = 5000

// EngineSource reads counts through an engine and statuses from the ledger
// the engine was built on.
type EngineSource struct {
	Engine *engine.Engine
	Ledger *ledger.Ledger
}

// Counts implements Source.
func (s EngineSource) Counts(ctx context.Context) (engine.Counts, error) { return s.Engine.Counts(ctx) }

// Statuses implements Source.
func (s EngineSource) Statuses(ctx context.Context, ids []string) (map[string]ledger.Status, error) {
	out := make(map[string]ledger.Status, len(ids))
	pool := s.Ledger.Pool()
	campaign := s.Engine.Config().CampaignID
	for len(ids) > 0 {
		n := min(len(ids), statusBatch)
		rows, err := pool.Query(ctx, sqlStatuses, campaign, ids[:n])
		if err != nil {
			return nil, fmt.Errorf("ledger statuses: %w", err)
		}
		for rows.Next() {
			var id, st string
			if err := rows.Scan(&id, &st); err != nil {
				rows.Close()
				return nil, fmt.Errorf("ledger statuses: %w", err)
			}
			out[id] = ledger.Status(st)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("ledger statuses: %w", err)
		}
		ids = ids[n:]
	}
	return out, nil
}
