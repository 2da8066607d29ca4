package stock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// faultKind stalls the server at addr (or the proxy in front of it) until restore.
type faultKind struct {
	name   string
	inject func(ctx context.Context, e *stallEnv, addr string) (restore func(context.Context) error, err error)
	proxy  func(p *testharness.FaultProxy) (string, error)
	// dropsTimedOut: the server drops a stalled command whose client hung
	// up (CLIENT PAUSE), so a call that timed out ran at most once, not
	// exactly once.
	dropsTimedOut bool
}

// debugSleep blocks the whole server for 3 s (the read timeout is 1 s),
// from a second connection. The call is sent once a probe finds the server
// not answering.
var debugSleep = faultKind{name: "debug-sleep", inject: func(ctx context.Context, _ *stallEnv, addr string) (func(context.Context) error, error) {
	probe := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 50 * time.Millisecond, MaxRetries: -1, PoolSize: 1})
	defer probe.Close()
	if err := testharness.PingAwake(ctx, probe); err != nil { // connected before the sleep
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- redisOn(addr).Do(ctx, "DEBUG", "SLEEP", "3").Err() }()
	for {
		select {
		case err := <-done:
			return nil, fmt.Errorf("DEBUG SLEEP ended before a probe saw it: %v", err)
		default:
		}
		err := probe.Ping(ctx).Err()
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
			break // the server is asleep
		}
		if err != nil {
			return nil, err
		}
	}
	return func(context.Context) error { return <-done }, nil
}}

// clientPause holds every write command (scripts included) until the call
// has returned; CLIENT UNPAUSE then lets what was sent run. A paused command
// whose connection closed meanwhile (the client timed out) never runs.
var clientPause = faultKind{name: "client-pause", dropsTimedOut: true, inject: func(ctx context.Context, _ *stallEnv, addr string) (func(context.Context) error, error) {
	if err := redisOn(addr).Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return redisOn(addr).Do(ctx, "CLIENT", "UNPAUSE").Err() }, nil
}}

func proxyFault(name string, add func(p *testharness.FaultProxy) (string, error)) faultKind {
	return faultKind{name: name, proxy: add, inject: func(_ context.Context, e *stallEnv, _ string) (func(context.Context) error, error) {
		if _, err := add(e.proxy); err != nil {
			return nil, err
		}
		return func(context.Context) error { e.proxy.RemoveAll(); return nil }, nil
	}}
}

// stallHook injects the fault when the first script call after arm is
// about to be sent, on the server it goes to.
type stallHook struct {
	env *stallEnv

	armed    atomic.Bool
	mu       sync.Mutex
	restores []func(context.Context) error
	errs     []error
	hit      bool
}

func (h *stallHook) arm() {
	h.mu.Lock()
	h.restores, h.errs, h.hit = nil, nil, false
	h.mu.Unlock()
	h.armed.Store(true)
}

func (h *stallHook) fired() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.hit }

// restore ends the fault (after the call returned) and reports what failed.
func (h *stallHook) restore(ctx context.Context) error {
	h.armed.Store(false)
	h.mu.Lock()
	defer h.mu.Unlock()
	errs := h.errs
	for _, r := range h.restores {
		errs = append(errs, r(ctx))
	}
	return errors.Join(errs...)
}

func (h *stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook: reserve calls go in pipelines when the tests run
// with FLASHSALE_TEST_RESERVE_PIPELINE.
func (h *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 {
			h.maybeInject(ctx, cmds[0])
		}
		return next(ctx, cmds)
	}
}

func (h *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.maybeInject(ctx, cmd)
		return next(ctx, cmd)
	}
}

func (h *stallHook) maybeInject(ctx context.Context, cmd redis.Cmder) {
	if name := cmd.Name(); (name == "evalsha" || name == "eval") && h.armed.CompareAndSwap(true, false) {
		addr := h.env.serverOf(ctx, cmd)
		restore, err := h.env.fault.inject(ctx, h.env, addr)
		h.mu.Lock()
		h.hit = true
		if err != nil {
			h.errs = append(h.errs, err)
		} else {
			h.restores = append(h.restores, restore)
		}
		h.mu.Unlock()
	}
}

// serverOf is the address of the server cmd goes to: the only one, or the
// master of its first key's slot.
func (e *stallEnv) serverOf(ctx context.Context, cmd redis.Cmder) string {
	c, ok := e.admin.(*redis.ClusterClient)
	if !ok {
		return e.servers[0]
	}
	args := cmd.Args()
	if len(args) < 4 {
		return e.servers[0]
	}
	node, err := c.MasterForKey(ctx, fmt.Sprint(args[3]))
	if err != nil {
		return e.servers[0]
	}
	return node.Options().Addr
}

var (
	adminMu      sync.Mutex
	adminClients = map[string]*redis.Client{}
)

// redisOn is a plain client of one server, for faults and statistics.
func redisOn(addr string) *redis.Client {
	adminMu.Lock()
	defer adminMu.Unlock()
	c, ok := adminClients[addr]
	if !ok {
		c = redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 30 * time.Second, MaxRetries: -1})
		adminClients[addr] = c
	}
	return c
}

// loadScripts puts every script but reserve (loaded per server by the Store)
// into the servers' caches, so that no call meets NOSCRIPT: its EVAL would
// be the script's only run, and hide a re-sent EVALSHA.
func loadScripts(servers []string) error {
	files, err := filepath.Glob("scripts/*.lua")
	if err != nil || len(files) == 0 {
		return fmt.Errorf("scripts: %v (%d files)", err, len(files))
	}
	ctx := context.Background()
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		for _, addr := range servers {
			if err := redisOn(addr).ScriptLoad(ctx, string(src)).Err(); err != nil {
				return fmt.Errorf("load %s on %s: %w", f, addr, err)
			}
		}
	}
	return nil
}

// scriptRuns is how many script calls the servers ran since CONFIG RESETSTAT.
func scriptRuns(t *testing.T, servers []string) int {
	t.Helper()
	total := 0
	for _, addr := range servers {
		total += testharness.ScriptRuns(t, redisOn(addr))
	}
	return total
}
