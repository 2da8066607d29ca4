package controllers_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A sale ends at its end with no operator there to write the ENDED gate: the
// shards carry the schedule, and the reserve script refuses past it by the
// Redis clock. The operator is stopped while the sale is open, and the
// reservation is tried once the Redis clock has passed the end.
func TestTheSaleEndsOnTimeWithoutTheOperator(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	end := time.Now().Add(15 * time.Second).Truncate(time.Second) // as the API stores it
	e.apply(e.sale("unattended", 50).schedule(time.Now().Add(-time.Minute), end))
	fs := e.waitFor("unattended", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	stop()

	eng := e.engineFor(fs, sharedRedis.Addr())
	ctx := context.Background()
	states, err := eng.Gates().ShardStates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range states {
		if st.State != stock.StateOpen || st.WindowEnd != end.UnixMilli() {
			t.Fatalf("shard %d when the operator stopped: gate %s, window end %d; want OPEN until %d (a machine too slow to open 15 s ahead of the end?)",
				st.Index, st.State, st.WindowEnd, end.UnixMilli())
		}
	}
	e.reserve(eng, "in-time")
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr()})
	defer rdb.Close()
	for {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !now.Before(end) {
			break
		}
		time.Sleep(min(end.Sub(now), 500*time.Millisecond))
	}
	r, err := eng.Reserve(ctx, "too-late", "r", 1)
	if err != nil || r.Outcome != "CLOSED" || r.Reason != stock.StateEnded {
		t.Fatalf("past the end with no operator: %+v %v, want CLOSED %s", r, err, stock.StateEnded)
	}
}

// A manager whose clock runs ahead opens the gate before the start; the
// shards' schedule keeps the sale closed until the start by the Redis clock,
// and the status says so: Scheduled, not admitting.
func TestAManagerClockAheadDoesNotOpenEarly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.clock = func() time.Time { return time.Now().Add(time.Hour) }
	e.startController()
	start := time.Now().Add(30 * time.Minute).Truncate(time.Second)
	e.apply(e.sale("early-clock", 50).schedule(start, start.Add(time.Hour)))
	fs := e.waitFor("early-clock", settle, "seeded", func(fs *flashsalev1alpha1.FlashSale) bool { return fs.Status.Epoch > 0 })
	eng := e.engineFor(fs, sharedRedis.Addr())
	testharness.Eventually(t, settle, "every gate OPEN by the manager's clock", func() bool {
		states, err := eng.Gates().ShardStates(context.Background())
		return err == nil && !slices.ContainsFunc(states, func(st stock.ShardState) bool { return st.State != stock.StateOpen })
	})
	r, err := eng.Reserve(context.Background(), "early", "r", 1)
	if err != nil || r.Outcome != "CLOSED" || r.Reason != stock.StateNotStarted {
		t.Fatalf("half an hour before the start: %+v %v, want CLOSED %s", r, err, stock.StateNotStarted)
	}
	e.waitFor("early-clock", settle, "reported as the shards answer", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseScheduled && conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse)
	})
}

// The same sale turns Open in its status at the start by the Redis clock,
// not at the next refresh of a scheduled sale (10 s later): the manager's
// clock has passed the start long before, and nothing else wakes it then.
func TestAManagerClockAheadReportsTheOpeningOnTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.clock = func() time.Time { return time.Now().Add(time.Hour) }
	e.startController()
	start := time.Now().Add(25 * time.Second).Truncate(time.Second)
	e.apply(e.sale("opens", 50).schedule(start, start.Add(3*time.Hour)))
	e.waitFor("opens", settle, "Scheduled by the Redis clock", phaseIs(flashsalev1alpha1.PhaseScheduled))
	const late = 3 * time.Second // the refresh of a scheduled sale is 10 s
	var opened time.Time
	testharness.Eventually(t, time.Minute, "Open", func() bool {
		if e.get("opens").Status.Phase == flashsalev1alpha1.PhaseOpen {
			opened = time.Now()
			return true
		}
		return false
	})
	if after := opened.Sub(start); after > late {
		t.Fatalf("reported Open %s after the start, want within %s", after.Round(time.Millisecond), late)
	}
}
