package stock_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// NotRun tells a server's refusal before a command ran from everything after
// which the command may have done something: a script's own error (here
// after a write), another error code that begins alike (BUSYKEY is no BUSY),
// and a reply that never came.
func TestNotRunOnlyForRefusalsBeforeRunning(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	if err := rdb.Set(ctx, "taken", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	dump, err := rdb.Dump(ctx, "taken").Result()
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	for _, tc := range []struct {
		what   string
		err    error
		refuse bool
	}{
		{"NOSCRIPT", rdb.EvalSha(ctx, "0123456789012345678901234567890123456789", nil).Err(), true},
		{"a script's error after a write", rdb.Eval(ctx, "redis.call('SET', KEYS[1], 1) return redis.call('INCR', KEYS[1], 'x')", []string{"k"}).Err(), false},
		{"BUSYKEY", rdb.Restore(ctx, "taken", 0, dump).Err(), false},
		{"no reply", rdb.Ping(short).Err(), false},
		{"no error", nil, false},
	} {
		if tc.err == nil && tc.what != "no error" {
			t.Fatalf("%s: no error", tc.what)
		}
		if got := stock.NotRun(tc.err); got != tc.refuse {
			t.Errorf("%s (%v): NotRun %v, want %v", tc.what, tc.err, got, tc.refuse)
		}
	}
}
