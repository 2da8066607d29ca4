package stock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// The sale's window in the shards' meta closes a shard by the Redis clock
// whatever its gate: an OPEN shard past the end answers ENDED and one before
// the start NOT_STARTED, on its stock and on a sold-out shard's claim alike,
// taking nothing. A window moved or removed opens it again; a shard with no
// meta is left without one.
func TestTheWindowClosesAnOpenShardByTheRedisClock(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		s := stock.New(rdb, "c-window-"+randomID(), 2)
		for shard, units := range []int64{5, 0} { // shard 1 sold out: a claim's path
			if _, err := s.Seed(ctx, shard, units, 1, stock.StateOpen, 0); err != nil {
				t.Fatal(err)
			}
		}
		now, err := s.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		request := func(shard int, mode stock.Mode, user string) stock.ReserveRequest {
			return stock.ReserveRequest{Shard: shard, Home: shard, Mode: mode, User: user, Key: "k-" + user,
				Quantity: 1, MaxPerUser: 1, TTL: time.Minute}
		}
		expect := func(when string, start, end time.Time, code stock.Code, status string) {
			t.Helper()
			if out, err := s.SetWindow(ctx, start, end); err != nil || out[0] != 1 || out[1] != 1 {
				t.Fatalf("%s: SetWindow: %v %v", when, out, err)
			}
			avail, reserved := totals(t, s)
			for _, r := range []stock.ReserveRequest{request(0, stock.ModeHome, when+"-a"), request(1, stock.ModeClaim, when+"-b")} {
				res, err := s.Reserve(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				if r.Mode == stock.ModeClaim && code == stock.Reserved {
					if res.Code != stock.Claimed {
						t.Fatalf("%s: claim %+v", when, res)
					}
					continue
				}
				if res.Code != code || res.Status != status {
					t.Fatalf("%s: shard %d (%s): %+v, want code %d %q", when, r.Shard, r.Mode, res, code, status)
				}
			}
			if code != stock.Reserved {
				if a, rs := totals(t, s); a != avail || rs != reserved {
					t.Fatalf("%s: a refused reservation moved the counts: %d/%d, were %d/%d", when, a, rs, avail, reserved)
				}
			}
		}
		expect("past the end", now.Add(-time.Hour), now.Add(-time.Millisecond), stock.Closed, stock.StateEnded)
		expect("before the start", now.Add(time.Hour), time.Time{}, stock.Closed, stock.StateNotStarted)
		expect("inside", now.Add(-time.Hour), now.Add(time.Hour), stock.Reserved, "R")

		states, err := s.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st := states[0]; st.State != stock.StateOpen || st.WindowStart != now.Add(-time.Hour).UnixMilli() || st.WindowEnd != now.Add(time.Hour).UnixMilli() {
			t.Fatalf("state %+v", st)
		}
		// A rebuild keeps the window: it is the schedule's, not the data's.
		if err := s.RebuildBegin(ctx, 0, 2); err != nil {
			t.Fatal(err)
		}
		if states, err = s.State(ctx); err != nil || states[0].State != stock.StateRebuilding || states[0].WindowEnd != now.Add(time.Hour).UnixMilli() {
			t.Fatalf("state being rebuilt %+v %v", states[0], err)
		}
		if err := s.RebuildFinish(ctx, 0, 5, 2, stock.StateOpen, 5, 0); err != nil {
			t.Fatal(err)
		}
		expect("no window", time.Time{}, time.Time{}, stock.Reserved, "R")
		if states, err = s.State(ctx); err != nil || states[0].WindowStart != 0 || states[0].WindowEnd != 0 {
			t.Fatalf("state without a window %+v %v", states[0], err)
		}

		gone := stock.New(rdb, "c-window-none-"+randomID(), 1)
		if out, err := gone.SetWindow(ctx, now, now.Add(time.Hour)); err != nil || out[0] != 0 {
			t.Fatalf("SetWindow without a meta: %v %v", out, err)
		}
		if states, err := gone.State(ctx); err != nil || states[0].Present {
			t.Fatalf("SetWindow made a meta: %+v %v", states, err)
		}
	})
}

// The window's edges as the reserve script draws them: ENDED from the end's
// millisecond on, NOT_STARTED before the start's; a zero time is no bound.
func TestOutsideWindowEdges(t *testing.T) {
	start, end := time.UnixMilli(1_000_000), time.UnixMilli(2_000_000)
	st := stock.ShardState{WindowStart: start.UnixMilli(), WindowEnd: end.UnixMilli()}
	for _, tc := range []struct {
		st   stock.ShardState
		at   time.Time
		want string
	}{
		{st, start.Add(-time.Millisecond), stock.StateNotStarted},
		{st, start, ""},
		{st, end.Add(-time.Millisecond), ""},
		{st, end, stock.StateEnded},
		{stock.ShardState{}, time.UnixMilli(1), ""},
	} {
		if got := tc.st.OutsideWindow(tc.at); got != tc.want {
			t.Errorf("%+v at %d: %q, want %q", tc.st, tc.at.UnixMilli(), got, tc.want)
		}
	}
	if !st.HasWindow(start, end) || st.HasWindow(start, time.Time{}) || !(stock.ShardState{}).HasWindow(time.Time{}, time.Time{}) {
		t.Error("HasWindow does not compare the edges as SetWindow records them")
	}
}
