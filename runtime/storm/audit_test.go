package storm

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// fakeSource returns counts[i] on the i-th call (the last one after that).
type fakeSource struct {
	counts   []engine.Counts
	calls    atomic.Int64
	statuses map[string]ledger.Status
}

func (f *fakeSource) Counts(context.Context) (engine.Counts, error) {
	i := min(int(f.calls.Add(1))-1, len(f.counts)-1)
	return f.counts[i], nil
}

func (f *fakeSource) Statuses(_ context.Context, ids []string) (map[string]ledger.Status, error) {
	out := map[string]ledger.Status{}
	for _, id := range ids {
		if s, ok := f.statuses[id]; ok {
			out[id] = s
		}
	}
	return out, nil
}

var (
	busy    = engine.Counts{Allocation: 10, Available: 2, Reserved: 3, Sold: 5, Pending: 3}
	settled = engine.Counts{Allocation: 10, Available: 5, Sold: 5}
)

func goodResult() *Result {
	return &Result{Acked: []string{"0.a", "1.b", "2.c"}, Confirmed: []string{"0.a"}, Cancelled: []string{"1.b"}}
}

func goodStatuses() map[string]ledger.Status {
	return map[string]ledger.Status{"0.a": ledger.StatusCommitted, "1.b": ledger.StatusCancelledByUser, "2.c": ledger.StatusCancelledBySweeper}
}

func TestAuditWaitsForTheSweeper(t *testing.T) {
	src := &fakeSource{counts: []engine.Counts{busy, busy, settled}, statuses: goodStatuses()}
	a, err := RunAudit(context.Background(), src, goodResult(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !a.OK || !a.Settled || !a.Conserved || a.Available != 5 || src.calls.Load() != 3 {
		t.Fatalf("audit %+v after %d reads", a, src.calls.Load())
	}
	if a.AckedInLedger != 3 || a.ConfirmedCommitted != 1 || a.CancelledByUser != 1 {
		t.Fatalf("ledger checks %+v", a)
	}
}

func TestAuditWithoutSettleIsOneRead(t *testing.T) {
	src := &fakeSource{counts: []engine.Counts{busy, settled}, statuses: goodStatuses()}
	a, err := RunAudit(context.Background(), src, goodResult(), 0)
	if err != nil {
		t.Fatal(err)
	}
	// Live reservations are fine without --settle: the numbers still add up.
	if !a.OK || a.Settled || a.SettleAsked || src.calls.Load() != 1 {
		t.Fatalf("audit %+v after %d reads", a, src.calls.Load())
	}
}

func TestAuditFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		counts engine.Counts
		status map[string]ledger.Status
		res    *Result
		settle time.Duration
		want   string
	}{
		{"oversold", engine.Counts{Allocation: 10, Sold: 11}, goodStatuses(), goodResult(), 0, "I1 oversold"},
		{"too many units", engine.Counts{Allocation: 10, Available: 6, Sold: 5}, goodStatuses(), goodResult(), 0, "I1: available 6 + sold 5 exceeds the allocation 10"},
		{"a shard's stock holds a sold unit", engine.Counts{Allocation: 10, Available: 5, Sold: 5, Shards: []engine.ShardCounts{
			{Index: 0, Present: true, Allocation: 5, Available: 3, Sold: 3},
			{Index: 1, Present: true, Allocation: 5, Available: 2, Sold: 2},
		}}, goodStatuses(), goodResult(), 0, "I1: shard 0: available 3 + sold 3 exceeds its allocation 5"},
		{"units lost", engine.Counts{Allocation: 10, Available: 4, Sold: 5}, goodStatuses(), goodResult(), 0, "I2"},
		{"not settled", busy, goodStatuses(), goodResult(), 300 * time.Millisecond, "not settled"},
		{"ack without row", settled, map[string]ledger.Status{"0.a": ledger.StatusCommitted, "1.b": ledger.StatusCancelledByUser}, goodResult(), 0, "no ledger row ([2.c])"},
		{"ack abandoned", settled, map[string]ledger.Status{"0.a": ledger.StatusCommitted, "1.b": ledger.StatusCancelledByUser, "2.c": ledger.StatusAbandoned}, goodResult(), 0, "ABANDONED"},
		{"paid not committed", settled, map[string]ledger.Status{"0.a": ledger.StatusPending, "1.b": ledger.StatusCancelledByUser, "2.c": ledger.StatusPending}, goodResult(), 0, "0.a=PENDING"},
		{"cancel not recorded", settled, map[string]ledger.Status{"0.a": ledger.StatusCommitted, "1.b": ledger.StatusCancelledBySweeper, "2.c": ledger.StatusPending}, goodResult(), 0, "cancels are not CANCELLED_BY_USER"},
		{"replay mismatch", settled, goodStatuses(), &Result{IdempotencyViolations: []string{"u k: 0.a vs 0.b"}}, 0, "I4"},
		{"sold after void", settled, map[string]ledger.Status{"0.a": ledger.StatusCommitted, "1.b": ledger.StatusCancelledByUser, "2.c": ledger.StatusCommitted},
			&Result{Acked: []string{"0.a", "1.b", "2.c"}, Confirmed: []string{"0.a"}, Cancelled: []string{"1.b"}, Voided: []string{"2.c"}}, 0, "I7: 1 checkouts answered EXPIRED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := RunAudit(context.Background(), &fakeSource{counts: []engine.Counts{tc.counts}, statuses: tc.status}, tc.res, tc.settle)
			if err != nil {
				t.Fatal(err)
			}
			if a.OK || !strings.Contains(strings.Join(a.Failures, "\n"), tc.want) {
				t.Fatalf("failures %q, want one containing %q", a.Failures, tc.want)
			}
		})
	}
}

// A checkout cut between its ledger commit and its Redis step leaves its unit
// both sold in the ledger and reserved in Redis until the sweeper settles it.
// Unsettled, that breaks I2's sum, not I1: no shard's stock holds a sold unit.
func TestAuditUnsettledCheckoutIsNotAnOversell(t *testing.T) {
	midCheckout := engine.Counts{Allocation: 10, Available: 4, Reserved: 1, Sold: 6, Shards: []engine.ShardCounts{
		{Index: 0, Present: true, Allocation: 5, Available: 2, Reserved: 1, Sold: 3},
		{Index: 1, Present: true, Allocation: 5, Available: 2, Sold: 3},
	}}
	a, err := RunAudit(context.Background(), &fakeSource{counts: []engine.Counts{midCheckout}, statuses: goodStatuses()}, goodResult(), 0)
	if err != nil {
		t.Fatal(err)
	}
	failures := strings.Join(a.Failures, "\n")
	if a.OK || !strings.Contains(failures, "I2") || strings.Contains(failures, "I1") {
		t.Fatalf("failures %q, want I2's and no I1", a.Failures)
	}
}

// When every request was answered, Redis and the ledger must agree shard by
// shard; totals that balance do not hide a shard that disagrees. After a
// transport error they may legitimately differ until the sweeper has run.
func TestAuditComparesShardsAfterACleanRun(t *testing.T) {
	skewed := engine.Counts{Allocation: 10, Available: 2, Reserved: 3, Sold: 5, Pending: 3, Shards: []engine.ShardCounts{
		{Index: 0, Available: 1, Reserved: 2, Sold: 2, Pending: 1, Allocation: 5},
		{Index: 1, Available: 1, Reserved: 1, Sold: 3, Pending: 2, Allocation: 5},
	}}
	statuses := goodStatuses()
	statuses["2.c"] = ledger.StatusPending
	res := goodResult()
	res.Outcomes = map[string]map[string]int64{OpReserve: {"201": 3}}
	a, err := RunAudit(context.Background(), &fakeSource{counts: []engine.Counts{skewed}, statuses: statuses}, res, 0)
	if err != nil {
		t.Fatal(err)
	}
	if a.OK || !a.CheckedShards || !strings.Contains(strings.Join(a.Failures, "\n"), "shard 0 holds 2 units") {
		t.Fatalf("a clean run with shards that disagree: %+v", a)
	}
	res.Outcomes[OpReserve]["ERR reset"] = 1
	a, err = RunAudit(context.Background(), &fakeSource{counts: []engine.Counts{skewed}, statuses: statuses}, res, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !a.OK || a.CheckedShards {
		t.Fatalf("after a transport error the shards are not compared: %+v", a)
	}
}

// A sweep between Counts' read of Redis and its read of the ledger makes one
// read disagree: the audit reads again, and only a lasting difference fails.
func TestAuditRereadsShardsThatDisagreeOnce(t *testing.T) {
	skewed := engine.Counts{Allocation: 10, Available: 2, Reserved: 3, Sold: 5, Pending: 2, Shards: []engine.ShardCounts{
		{Index: 0, Available: 1, Reserved: 2, Sold: 2, Pending: 1, Allocation: 5},
		{Index: 1, Available: 1, Reserved: 1, Sold: 3, Pending: 1, Allocation: 5},
	}}
	agreed := skewed
	agreed.Shards = slices.Clone(skewed.Shards)
	agreed.Shards[0].Reserved, agreed.Shards[0].Available, agreed.Reserved, agreed.Available = 1, 2, 2, 3
	statuses := goodStatuses()
	statuses["2.c"] = ledger.StatusPending
	res := goodResult()
	res.Outcomes = map[string]map[string]int64{OpReserve: {"201": 3}}
	src := &fakeSource{counts: []engine.Counts{skewed, skewed, agreed}, statuses: statuses}
	a, err := RunAudit(context.Background(), src, res, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !a.OK || !a.CheckedShards || src.calls.Load() != 3 {
		t.Fatalf("a passing difference failed the audit (%d reads): %+v", src.calls.Load(), a)
	}
}

// An interrupt ends the settle wait at once; the checks still run.
func TestAuditSettleWaitEndsOnStop(t *testing.T) {
	stop := make(chan struct{})
	close(stop)
	start := time.Now()
	a, err := RunAuditUntil(context.Background(), stop, &fakeSource{counts: []engine.Counts{busy}, statuses: goodStatuses()}, goodResult(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second || a.Settled || a.OK {
		t.Fatalf("after %s: %+v", d, a)
	}
}

func TestReportTextAndJSON(t *testing.T) {
	res := goodResult()
	res.Elapsed, res.Journeys, res.Requests = 2*time.Second, 100, 130
	res.Outcomes = map[string]map[string]int64{OpReserve: {"201": 3, "410 SOLD_OUT": 97}, OpCheckout: {"200": 1}}
	res.Latency = map[string]Latency{OpReserve: {Count: 100, P50: time.Millisecond, P90: 2 * time.Millisecond, P99: 5 * time.Millisecond, Max: 9 * time.Millisecond}}
	a, err := RunAudit(context.Background(), &fakeSource{counts: []engine.Counts{settled}, statuses: goodStatuses()}, res, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReport(Config{URLs: []string{"http://127.0.0.1:1"}, SKU: "s", Buyers: 100, Concurrency: 4}, res, a)
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"65 req/s", "410 SOLD_OUT", "97", "p99", "5.00", "conserved", "settled", "3/3 acknowledged", "\nOK\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, b.String())
		}
	}
	j, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		OK        bool                          `json:"ok"`
		Outcomes  map[string]map[string]int64   `json:"outcomes"`
		LatencyMS map[string]map[string]float64 `json:"latency_ms"`
		Audit     struct {
			Conserved bool     `json:"conserved"`
			Oversold  int64    `json:"oversold"`
			Failures  []string `json:"failures"`
		} `json:"audit"`
	}
	if err := json.Unmarshal(j, &back); err != nil {
		t.Fatal(err)
	}
	if !back.OK || !back.Audit.Conserved || back.Outcomes[OpReserve]["201"] != 3 || back.LatencyMS[OpReserve]["p99"] != 5 {
		t.Fatalf("json %s", j)
	}
	if p := FormatProgress(Progress{Elapsed: time.Second, Journeys: 5, Planned: 10, Requests: 50}); !strings.Contains(p, "5/10") || !strings.Contains(p, "50 (50/s)") {
		t.Fatalf("progress %q", p)
	}
}
