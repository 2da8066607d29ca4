package stock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// A server that restarts from a snapshot between the two commands of a
// reserve script load (its run id read, the script loaded) must not get the
// script that carries its previous run id: that body would accept the
// snapshot's stock, which misses every reservation made since, as verified.
func TestLoadRacingARestartLoadsNothing(t *testing.T) {
	r, rdb, s := oneShard(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reserve := func(user string) (ShardResult, error) { return reserveOne(ctx, s, user) }
	if res, err := reserve("before"); err != nil || res.Code != Reserved {
		t.Fatalf("first reserve: %+v %v", res, err)
	}
	// The snapshot the server restarts from holds 9 units. One more is sold
	// after it: the restarted server must not sell that unit again.
	if err := rdb.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if res, err := reserve("after-snapshot"); err != nil || res.Code != Reserved {
		t.Fatalf("second reserve: %+v %v", res, err)
	}
	// Make the next reserve load the script again, and restart the server
	// (without saving) between its two commands.
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	testHookRunIDRead = func() {
		if restarted {
			return
		}
		restarted = true
		if err := r.Kill(); err != nil {
			t.Error(err)
		}
		if err := r.Start(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { testHookRunIDRead = nil })

	res, err := reserve("racing")
	if !restarted {
		t.Fatal("the reserve did not load the script")
	}
	if err == nil && res.Code == Reserved {
		t.Fatalf("a reserve whose script load raced a restart sold the snapshot's stock: %+v", res)
	}
	// From now on every call meets the restarted server, and is refused.
	var next ShardResult
	deadline := time.Now().Add(20 * time.Second)
	for {
		if next, err = reserve("next"); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || next.Code != Closed || next.Status != ReasonUnverified {
		t.Fatalf("after the restart: %+v %v", next, err)
	}
	if n, err := rdb.Get(ctx, s.Keys(0).Stock()).Int64(); err != nil || n != 9 {
		t.Fatalf("stock %d %v, want the snapshot's 9 untouched", n, err)
	}
}

// After a server forgets its scripts, the callers that meet NOSCRIPT at once
// share one load instead of each opening a connection to load the script.
func TestConcurrentNoScriptLoadsOnce(t *testing.T) {
	_, rdb, s := oneShard(t, 1000)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reserve := func(user string) error {
		res, err := reserveOne(ctx, s, user)
		if err == nil && res.Code != Reserved {
			err = fmt.Errorf("%+v", res)
		}
		return err
	}
	if err := reserve("first"); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Go(func() { errs <- reserve(fmt.Sprintf("u%d", i)) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, "cmdstat_script|load:calls=1,") {
		t.Fatalf("want one SCRIPT LOAD:\n%s", info)
	}
}

// oneShard starts a Redis and seeds a campaign of one open shard on it.
func oneShard(t *testing.T, units int64) (*testharness.Redis, *redis.Client, *Store) {
	t.Helper()
	r := testharness.RedisT(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	s := New(rdb, "c-"+strings.ToLower(t.Name()), 1)
	if _, err := s.Seed(context.Background(), 0, units, 1, StateOpen, 0); err != nil {
		t.Fatal(err)
	}
	return r, rdb, s
}

// reserveOne reserves one unit for user, with a request key of its own.
func reserveOne(ctx context.Context, s *Store, user string) (ShardResult, error) {
	return s.Reserve(ctx, ReserveRequest{
		Shard: 0, Home: 0, Mode: ModeHome, User: user, Key: "k-" + user,
		Quantity: 1, MaxPerUser: 1, TTL: time.Minute,
	})
}

// Callers waiting for another caller's script load give up at their own
// deadlines when the server hangs (here: redis-server stopped with SIGSTOP),
// instead of queueing behind the load; the load itself completes once the
// server answers again.
func TestLoadWaitEndsWithTheCallersContext(t *testing.T) {
	r, _, seeded := oneShard(t, 10)
	// Another process of the same campaign, with nothing loaded yet, whose
	// reads wait long for a hung server.
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ReadTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	s := New(rdb, seeded.campaign, 1)
	if err := syscall.Kill(r.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(r.PID(), syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)

	// The first caller, with a long deadline, holds the load.
	held := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := reserveOne(ctx, s, "holder")
		if err == nil && res.Code != Reserved {
			err = fmt.Errorf("%+v", res)
		}
		held <- err
	}()
	loading := s.server(r.Addr()).loading
	for deadline := time.Now().Add(10 * time.Second); len(loading) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first caller never started its load")
		}
	}

	var wg sync.WaitGroup
	start := time.Now()
	for i := range 10 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if _, err := reserveOne(ctx, s, fmt.Sprintf("waiter%d", i)); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("waiter %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("waiters with 300ms deadlines returned after %v: they queued behind the load", d)
	}
	resume()
	if err := <-held; err != nil {
		t.Fatalf("the load after the server resumed: %v", err)
	}
}
