package stock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Deleting a sale on a shared Redis removes all of its keys, page after page
// of SCAN, and none of anyone else's: here another sale's and 5,000 keys of
// other applications.
func TestDeleteOnASharedRedis(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		s := openSale(t, rdb, "c-"+randomID(), 4, 2500)
		other := openSale(t, rdb, "c-"+randomID(), 4, 3)
		for i := range 3 {
			if r, err := reserveHome(ctx, other, fmt.Sprintf("o-%d", i)); err != nil || r.Code != stock.Reserved {
				t.Fatalf("reserve on the other sale: %+v %v", r, err)
			}
		}
		for i := range 2500 {
			if r, err := reserveHome(ctx, s, fmt.Sprintf("u%d", i)); err != nil || r.Code != stock.Reserved {
				t.Fatalf("reserve %d: %+v %v", i, r, err)
			}
		}
		prefix := "app-" + randomID() + ":"
		for i := 0; i < 5000; i += 500 {
			pipe := rdb.Pipeline()
			for j := i; j < i+500; j++ {
				pipe.Set(ctx, fmt.Sprintf("%s%d", prefix, j), "x", time.Hour)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		n, err := s.DeleteAll(ctx)
		if err != nil || n < 2500 {
			t.Fatalf("DeleteAll: %d keys, %v", n, err)
		}
		if n, _ := s.DeleteAll(ctx); n != 0 {
			t.Fatalf("%d keys left", n)
		}
		for i := 0; i < 5000; i += 997 {
			if v, err := rdb.Get(ctx, fmt.Sprintf("%s%d", prefix, i)).Result(); err != nil || v != "x" {
				t.Fatalf("another application's key %d: %q %v", i, v, err)
			}
		}
		if available, reserved := totals(t, other); reserved != 3 || available != 9 {
			t.Fatalf("the other sale: %d available, %d reserved", available, reserved)
		}
	})
}
