package testharness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Direction is the way data flows through a FaultProxy that a fault acts on.
type Direction string

const (
	// Upstream is client to server: a fault here keeps a request from the
	// server (it never ran).
	Upstream Direction = "upstream"
	// Downstream is server to client: a fault here loses or delays the
	// reply of a request that the server ran.
	Downstream Direction = "downstream"
)

// FaultProxy is a TCP proxy on 127.0.0.1 in front of one server (toxiproxy,
// in this process, without its HTTP API) that injects faults on command:
// latency, timeouts that swallow data, connection resets. A fault acts on the
// connections open when it is added and on every later one, until it is
// removed.
type FaultProxy struct {
	p        *toxiproxy.Proxy
	upstream string

	mu     sync.Mutex
	n      int
	closed bool
}

// StartFaultProxy starts a proxy to upstream (host:port) on a free reserved
// port of 127.0.0.1. CloseAll closes it.
func StartFaultProxy(upstream string) (*FaultProxy, error) {
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	var err error
	for range startAttempts {
		var port int
		if port, err = FreePort(); err != nil {
			return nil, err
		}
		listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p := toxiproxy.NewProxy(server, "fault-"+strconv.Itoa(port), listen, upstream)
		if err = p.Start(); err == nil {
			f := &FaultProxy{p: p, upstream: upstream}
			register(f)
			return f, nil
		}
	}
	return nil, fmt.Errorf("fault proxy to %s: %w", upstream, err)
}

// FaultProxyT starts a FaultProxy for a test and closes it in t.Cleanup.
func FaultProxyT(t testing.TB, upstream string) *FaultProxy {
	t.Helper()
	f, err := StartFaultProxy(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// Addr is the proxy's "127.0.0.1:PORT": what a client dials instead of the
// upstream.
func (f *FaultProxy) Addr() string { return f.p.Listen }

// Upstream is the server behind the proxy.
func (f *FaultProxy) Upstream() string { return f.upstream }

// Latency delays the data flowing in dir by d (each chunk, as it arrives),
// a whole number of milliseconds: the proxy counts in them, and would
// round anything shorter to no delay at all. It returns the fault's name,
// for Remove.
func (f *FaultProxy) Latency(dir Direction, d time.Duration) (string, error) {
	if d <= 0 || d%time.Millisecond != 0 {
		return "", fmt.Errorf("fault proxy: latency %v is not a positive whole number of milliseconds", d)
	}
	return f.add("latency", dir, map[string]int64{"latency": d.Milliseconds()})
}

// wholeMillis refuses a duration the proxy would round down: to 0, which
// means "at once" or "never", the opposite of a short delay.
func wholeMillis(what string, d time.Duration) error {
	if d < 0 || d%time.Millisecond != 0 {
		return fmt.Errorf("fault proxy: %s %v is not a whole number of milliseconds", what, d)
	}
	return nil
}

// Timeout swallows every byte flowing in dir. With after > 0 the proxy then
// closes the connection after that long; with 0 it holds it open, silent,
// until the fault is removed. Data swallowed is lost, also after the removal.
func (f *FaultProxy) Timeout(dir Direction, after time.Duration) (string, error) {
	if err := wholeMillis("timeout", after); err != nil {
		return "", err
	}
	return f.add("timeout", dir, map[string]int64{"timeout": after.Milliseconds()})
}

// ResetPeer resets (TCP RST, unsent data dropped) each connection once data
// flows in dir, after the given delay: with Downstream, a request reaches
// the server and its reply never comes back.
func (f *FaultProxy) ResetPeer(dir Direction, after time.Duration) (string, error) {
	if err := wholeMillis("reset delay", after); err != nil {
		return "", err
	}
	return f.add("reset_peer", dir, map[string]int64{"timeout": after.Milliseconds()})
}

// Remove ends a fault added by Latency, Timeout or ResetPeer.
func (f *FaultProxy) Remove(name string) error {
	if err := f.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		return fmt.Errorf("fault proxy: remove %s: %w", name, err)
	}
	return nil
}

// RemoveAll ends every fault.
func (f *FaultProxy) RemoveAll() {
	f.p.Toxics.ResetToxics(context.Background())
}

// Faults lists the names of the faults in force.
func (f *FaultProxy) Faults() []string {
	var names []string
	for _, t := range f.p.Toxics.GetToxicArray() {
		if w, ok := t.(*toxics.ToxicWrapper); ok {
			names = append(names, w.Name)
		}
	}
	return names
}

func (f *FaultProxy) add(kind string, dir Direction, attrs map[string]int64) (string, error) {
	if dir != Upstream && dir != Downstream {
		return "", fmt.Errorf("fault proxy: direction %q is neither %q nor %q", dir, Upstream, Downstream)
	}
	for k, v := range attrs {
		if v < 0 {
			return "", fmt.Errorf("fault proxy: %s %s must not be negative", kind, k)
		}
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return "", errors.New("fault proxy: closed")
	}
	f.n++
	name := fmt.Sprintf("%s_%s_%d", kind, dir, f.n)
	f.mu.Unlock()
	body, err := json.Marshal(map[string]any{
		"name": name, "type": kind, "stream": string(dir), "toxicity": 1.0, "attributes": attrs,
	})
	if err != nil {
		return "", err
	}
	if _, err := f.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		return "", fmt.Errorf("fault proxy: add %s: %w", name, err)
	}
	return name, nil
}

// Close removes the faults (so that nothing waits on a swallowed stream),
// stops listening and closes every connection through the proxy.
func (f *FaultProxy) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	unregister(f)
	f.RemoveAll()
	f.p.Stop()
	return nil
}
