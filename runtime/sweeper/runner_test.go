package sweeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// fakeElector leads while lead is true and records its calls.
type fakeElector struct {
	lead     atomic.Bool
	err      error
	acquires atomic.Int64
	released chan struct{}
	once     sync.Once
	// asked, when set, is told of each Acquire, which then waits for hold.
	asked, hold chan struct{}
}

func newFakeElector(lead bool) *fakeElector {
	e := &fakeElector{released: make(chan struct{})}
	e.lead.Store(lead)
	return e
}

func (e *fakeElector) Kind() string { return "fake" }
func (e *fakeElector) Acquire(context.Context) (bool, error) {
	e.acquires.Add(1)
	if e.asked != nil {
		e.asked <- struct{}{}
		<-e.hold
	}
	return e.lead.Load(), e.err
}
func (e *fakeElector) Release(context.Context) error {
	e.once.Do(func() { close(e.released) })
	return nil
}

// run starts r; done is closed when Run has returned, with its error in *err.
func run(t *testing.T, r *Runner) (cancel func(), done <-chan struct{}, err *error) {
	t.Helper()
	ctx, c := context.WithCancel(context.Background())
	ch := make(chan struct{})
	var runErr error
	go func() { runErr = r.Run(ctx); close(ch) }()
	t.Cleanup(func() {
		c()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	})
	return c, ch, &runErr
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRunnerSweepsOnlyWhileLeading(t *testing.T) {
	var passes atomic.Int64
	el := newFakeElector(false)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	r := &Runner{
		Pass: func(context.Context) (engine.SweepStats, error) {
			passes.Add(1)
			return engine.SweepStats{Released: 2, Committed: 1, Abandoned: 1, Skipped: 3}, nil
		},
		Elector: el, Interval: 5 * time.Millisecond, Metrics: m,
	}
	run(t, r)
	waitFor(t, "several elections", func() bool { return el.acquires.Load() >= 5 })
	if n := passes.Load(); n != 0 {
		t.Fatalf("%d passes while following", n)
	}
	if v := testutil.ToFloat64(m.leader); v != 0 {
		t.Fatalf("leader gauge %v while following", v)
	}
	el.lead.Store(true)
	waitFor(t, "passes while leading", func() bool { return passes.Load() >= 3 })
	waitFor(t, "leader gauge", func() bool { return testutil.ToFloat64(m.leader) == 1 })
	el.lead.Store(false)
	waitFor(t, "leader gauge back to 0", func() bool { return testutil.ToFloat64(m.leader) == 0 })
	stopped := passes.Load()
	time.Sleep(30 * time.Millisecond)
	if n := passes.Load(); n != stopped {
		t.Fatalf("%d passes after leadership was lost", n-stopped)
	}
	ok := testutil.ToFloat64(m.passes.WithLabelValues("ok"))
	if ok != float64(stopped) {
		t.Fatalf("passes_total{ok} %v, want %d", ok, stopped)
	}
	if got := testutil.ToFloat64(m.reservations.WithLabelValues("released")); got != 2*ok {
		t.Fatalf("released %v, want %v", got, 2*ok)
	}
	if got := testutil.ToFloat64(m.reservations.WithLabelValues("skipped")); got != 3*ok {
		t.Fatalf("skipped %v, want %v", got, 3*ok)
	}
}

// SIGTERM (ctx cancelled) in the middle of a pass: the pass keeps a live
// context and completes, and only then is leadership released.
func TestRunnerFinishesPassBeforeRelease(t *testing.T) {
	el := newFakeElector(true)
	entered := make(chan struct{})
	finish := make(chan struct{})
	var passErr atomic.Value
	var completed atomic.Bool
	r := &Runner{
		Pass: func(ctx context.Context) (engine.SweepStats, error) {
			close(entered)
			<-finish
			if ctx.Err() != nil {
				passErr.Store(ctx.Err())
			}
			completed.Store(true)
			return engine.SweepStats{}, nil
		},
		Elector: el, Interval: time.Hour,
	}
	cancel, done, runErr := run(t, r)
	<-entered
	cancel()
	select {
	case <-el.released:
		t.Fatal("leadership released while a pass was running")
	case <-done:
		t.Fatal("Run returned while a pass was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(finish)
	select {
	case <-done:
		if *runErr != nil {
			t.Fatalf("Run: %v", *runErr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the pass")
	}
	if !completed.Load() {
		t.Fatal("the pass did not complete")
	}
	if err := passErr.Load(); err != nil {
		t.Fatalf("the pass saw its context cancelled: %v", err)
	}
	select {
	case <-el.released:
	default:
		t.Fatal("leadership not released on shutdown")
	}
}

// A SIGTERM that arrives while the election is asked (a lock's ping, up to
// its own bound) starts no pass: the election, the pass and the release
// together would outlast the pod's termination grace.
func TestRunnerStoppedDuringTheElectionStartsNoPass(t *testing.T) {
	el := newFakeElector(true)
	el.asked, el.hold = make(chan struct{}, 1), make(chan struct{})
	var passes atomic.Int64
	r := &Runner{
		Pass:    func(context.Context) (engine.SweepStats, error) { passes.Add(1); return engine.SweepStats{}, nil },
		Elector: el, Interval: time.Hour,
	}
	cancel, done, runErr := run(t, r)
	<-el.asked
	cancel()
	close(el.hold)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
	if *runErr != nil || passes.Load() != 0 {
		t.Fatalf("Run: %v, %d passes; want none after the SIGTERM", *runErr, passes.Load())
	}
	select {
	case <-el.released:
	default:
		t.Fatal("leadership not released on shutdown")
	}
}

func TestRunnerCountsFailedPassesAndKeepsGoing(t *testing.T) {
	var passes atomic.Int64
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	r := &Runner{
		Pass: func(context.Context) (engine.SweepStats, error) {
			passes.Add(1)
			return engine.SweepStats{Released: 1}, errors.New("shard 3: boom")
		},
		Elector: newFakeElector(true), Interval: time.Millisecond, Metrics: m,
	}
	run(t, r)
	waitFor(t, "failed passes", func() bool { return passes.Load() >= 3 })
	waitFor(t, "error counter", func() bool { return testutil.ToFloat64(m.passes.WithLabelValues("error")) >= 3 })
	// Work done before the error still counts.
	if testutil.ToFloat64(m.reservations.WithLabelValues("released")) < 3 {
		t.Fatal("released units of failed passes not counted")
	}
}

func TestRunnerRejectsBadConfig(t *testing.T) {
	for _, r := range []*Runner{
		{Elector: newFakeElector(true), Interval: time.Second},
		{Pass: func(context.Context) (engine.SweepStats, error) { return engine.SweepStats{}, nil }, Interval: time.Second},
		{Pass: func(context.Context) (engine.SweepStats, error) { return engine.SweepStats{}, nil }, Elector: newFakeElector(true)},
	} {
		if err := r.Run(context.Background()); err == nil {
			t.Errorf("Run(%+v) accepted a bad configuration", r)
		}
	}
}

func TestMetricsExposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	want := []string{
		"flashsale_sweeper_passes_total", "flashsale_sweeper_reservations_total",
		"flashsale_sweeper_pass_duration_seconds", "flashsale_sweeper_leader",
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		got = append(got, mf.GetName())
	}
	for _, w := range want {
		if !strings.Contains(strings.Join(got, " "), w) {
			t.Errorf("metric %s missing (have %v)", w, got)
		}
	}
}

// The stall alert's inputs: the interval, and when a pass last finished (not
// a failed one; 0 before the first).
func TestMetricsTellTheLastPass(t *testing.T) {
	for _, failing := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		m := NewMetrics(reg)
		passed := make(chan struct{}, 1)
		r := &Runner{
			Pass: func(context.Context) (engine.SweepStats, error) {
				defer func() { passed <- struct{}{} }()
				if failing {
					return engine.SweepStats{}, errors.New("ledger down")
				}
				return engine.SweepStats{}, nil
			},
			Elector: newFakeElector(true), Interval: time.Hour, Metrics: m,
		}
		before := float64(time.Now().Unix())
		run(t, r)
		<-passed
		waitFor(t, "the pass counted", func() bool {
			return testutil.ToFloat64(m.passes.WithLabelValues("ok"))+testutil.ToFloat64(m.passes.WithLabelValues("error")) == 1
		})
		if got := testutil.ToFloat64(m.interval); got != 3600 {
			t.Errorf("interval gauge %v, want 3600", got)
		}
		last := testutil.ToFloat64(m.lastPass)
		if failing && last != 0 || !failing && (last < before || last > float64(time.Now().Unix()+1)) {
			t.Errorf("failing=%v: last pass %v (the run began at %v)", failing, last, before)
		}
	}
}

// A pass that reaches its time limit after doing work left a backlog: it is
// counted as cut, not as an error, and the next pass starts at once instead of
// an interval later.
func TestRunnerGoesOnAfterACutPass(t *testing.T) {
	var passes atomic.Int64
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	r := &Runner{
		Pass: func(ctx context.Context) (engine.SweepStats, error) {
			if passes.Add(1) > 3 {
				return engine.SweepStats{}, nil
			}
			<-ctx.Done()
			return engine.SweepStats{Released: 5}, fmt.Errorf("sweep shard 0: %w", ctx.Err())
		},
		Elector: newFakeElector(true), Interval: time.Hour, PassTimeout: 20 * time.Millisecond, Metrics: m,
	}
	run(t, r)
	waitFor(t, "passes after the cut ones", func() bool { return passes.Load() >= 4 })
	if cut, failed := testutil.ToFloat64(m.passes.WithLabelValues("cut")), testutil.ToFloat64(m.passes.WithLabelValues("error")); cut != 3 || failed != 0 {
		t.Fatalf("cut %v, error %v", cut, failed)
	}
}

// A pass that leaves shards with a backlog past their budget goes on at once
// too, counted ok: the pass ended by itself.
// So does one that failed on some shard (a Redis Cluster master that does not
// answer) while others were left with a backlog: the healthy shards drain at
// once, not one budget an interval.
func TestRunnerGoesOnAfterAPassWithABacklog(t *testing.T) {
	for _, failing := range []bool{false, true} {
		var passes atomic.Int64
		reg := prometheus.NewRegistry()
		m := NewMetrics(reg)
		r := &Runner{
			Pass: func(context.Context) (engine.SweepStats, error) {
				if passes.Add(1) > 3 {
					return engine.SweepStats{}, nil
				}
				if failing {
					return engine.SweepStats{Released: 2048, Backlog: 1}, errors.New("sweep shard 3: redis time: i/o timeout")
				}
				return engine.SweepStats{Released: 2048, Backlog: 1}, nil
			},
			Elector: newFakeElector(true), Interval: time.Hour, Metrics: m,
		}
		run(t, r)
		waitFor(t, "passes after the ones with a backlog", func() bool { return passes.Load() >= 4 })
		result := map[bool]string{false: "ok", true: "error"}[failing]
		if n := testutil.ToFloat64(m.passes.WithLabelValues(result)); n < 3 {
			t.Fatalf("%s passes %v", result, n)
		}
	}
}

// A pass that ignores its deadline (a call that never returns) turns the
// liveness check into an error, so the kubelet restarts the process instead
// of a stuck sweeper looking healthy while no unit comes back. One that
// returns makes it live again.
func TestRunnerStuckInAPassIsNotLive(t *testing.T) {
	entered, unblock := make(chan struct{}, 1), make(chan struct{})
	var passes atomic.Int64
	r := &Runner{
		Pass: func(context.Context) (engine.SweepStats, error) {
			if passes.Add(1) == 1 {
				entered <- struct{}{}
				<-unblock // ignores its context
			}
			return engine.SweepStats{}, nil
		},
		Elector:     newFakeElector(true),
		Interval:    time.Hour,
		PassTimeout: 20 * time.Millisecond,
	}
	if err := r.Live(); err != nil {
		t.Fatalf("live before the first pass: %v", err)
	}
	run(t, r)
	<-entered
	waitFor(t, "the stuck pass reported", func() bool { return r.Live() != nil })
	if err := r.Live(); !strings.Contains(err.Error(), "stuck") {
		t.Fatalf("Live: %v", err)
	}
	close(unblock)
	waitFor(t, "live again once the pass returned", func() bool { return r.Live() == nil })
}
