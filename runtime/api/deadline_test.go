package api

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Every request gets a deadline no earlier than RequestTimeout after it
// starts and at most one slot later, from any number of goroutines at once.
func TestRequestDeadlinesBoundEveryRequest(t *testing.T) {
	const timeout = 2 * time.Second
	d := newRequestDeadlines(timeout)
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for range 8 {
		wg.Go(func() {
			for range 2000 {
				start := time.Now()
				ctx := d.context()
				end := time.Now()
				dl, ok := ctx.Deadline()
				switch {
				case !ok:
					errs <- "a request context without a deadline"
					return
				case dl.Before(start.Add(timeout)):
					errs <- "deadline " + dl.Sub(start).String() + " after the start, shorter than the timeout " + timeout.String()
					return
				case dl.After(end.Add(timeout + deadlineSlot)):
					errs <- "deadline " + dl.Sub(end).String() + " after the call returned, past the timeout and one slot"
					return
				case ctx.Err() != nil:
					errs <- "a fresh request context is already done: " + ctx.Err().Error()
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// Requests that start in one slot share a context, so there are at most as
// many contexts (and timers) as slots, and a new slot gets a new one.
func TestRequestDeadlinesShareOneContextPerSlot(t *testing.T) {
	d := newRequestDeadlines(time.Minute)
	seen := map[context.Context]bool{}
	calls := 0
	start := time.Now()
	for time.Since(start) < 20*deadlineSlot {
		seen[d.context()] = true
		calls++
	}
	elapsed := time.Since(start)
	if most := int(elapsed/deadlineSlot) + 2; len(seen) > most {
		t.Fatalf("%d contexts in %s (%d calls), want at most one per slot (%d)", len(seen), elapsed, calls, most)
	}
	if len(seen) < 2 {
		t.Fatalf("one context for %d calls over %s: a new slot must get a new deadline", calls, elapsed)
	}
}

// The shared context ends the work at its deadline, as WithTimeout did.
func TestRequestDeadlineEndsTheWork(t *testing.T) {
	const timeout = 30 * time.Millisecond
	d := newRequestDeadlines(timeout)
	start := time.Now()
	ctx := d.context()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a request context never ended")
	}
	if waited := time.Since(start); waited < timeout {
		t.Fatalf("a request context ended after %s, before its timeout %s", waited, timeout)
	}
	if ctx.Err() != context.DeadlineExceeded {
		t.Fatalf("err %v, want context.DeadlineExceeded", ctx.Err())
	}
}

// BenchmarkRequestDeadline compares the shared deadline with a context and a
// timer per request, as the handlers had, under a request context from
// net/http (a cancel context of its own).
func BenchmarkRequestDeadline(b *testing.B) {
	parent, stop := context.WithCancel(context.Background())
	defer stop()
	b.Run("per-request", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ctx, cancel := context.WithTimeout(parent, DefaultRequestTimeout)
				_ = ctx.Err()
				cancel()
			}
		})
	})
	b.Run("shared", func(b *testing.B) {
		d := newRequestDeadlines(DefaultRequestTimeout)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = d.context().Err()
			}
		})
	})
}
