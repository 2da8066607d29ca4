package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A shard that lost its data lost the sale's schedule with it: the rebuild
// writes the schedule of the moment it opens the shards, so that they refuse
// past the end by the Redis clock from their first call, as before the loss.
func TestARebuildWritesTheScheduleBeforeItOpens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()), withShards(2))
	now, err := f.e.Store().Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start, end := now.Add(-time.Hour), now.Add(-time.Second)
	for i := range 2 { // the data lost
		if err := f.rdb.Del(ctx, f.e.Store().Keys(i).Meta()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.e.RebuildWith(ctx, engine.RebuildOptions{
		Gate:     openGate,
		Schedule: func() (time.Time, time.Time) { return start, end },
	}); err != nil {
		t.Fatal(err)
	}
	states, err := f.e.Gates().ShardStates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range states {
		if st.State != stock.StateOpen || st.WindowStart != start.UnixMilli() || st.WindowEnd != end.UnixMilli() {
			t.Fatalf("shard %d after the rebuild: %+v, want OPEN with the schedule", st.Index, st)
		}
	}
	if r := f.reserve("late", "r", 1); r.Outcome != engine.OutcomeClosed || r.Reason != stock.StateEnded {
		t.Fatalf("past the end after the rebuild: %+v", r)
	}
}
