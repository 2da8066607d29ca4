package api

import (
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// While it has no place for the next connection, a listener sweeps once
// every idleGrace: it looks at up to sweepScan of its connections (Go's map
// order makes them a fresh sample each time) and closes up to drainIdle of
// those idle for idleGrace or more. A connection idle for less is between a
// storm buyer's requests: closing it would lose the next one, on its way.
const (
	drainIdle = 16
	sweepScan = 1024
	idleGrace = time.Second
)

// boundedListener accepts at most n connections open at once: past them it
// accepts none until one closes, and the next wait in the kernel's listen
// queue. The process keeps so the files its own connections to Redis and
// the ledger, and its metrics listener (where the kubelet probes it), need.
//
// A connection must not hold its place for nothing while others wait: at the
// bound each answer closes its connection (Server.closeWhenDraining), and
// while no place is free the listener closes connections that have sat idle
// for a second, as a kept-alive connection's idle timeout would, only
// sooner, whether or not anyone waits in the kernel's queue. Doing both only
// while someone waits (the queue is read for flashsale_api_connections_waiting)
// was measured and does not pay: idle connections kept until a buyer comes
// are closed just as their clients send on them again
// (docs/capacity-runs-overload.md).
type boundedListener struct {
	net.Listener
	places chan struct{} // a token per open connection, and one for the Accept waiting
	open   atomic.Int64  // connections accepted and not yet closed
	done   chan struct{} // closed by Close: a waiting Accept returns
	once   sync.Once

	grace     time.Duration      // idleGrace; tests set less
	queue     func() (int, bool) // the kernel's accept queue; nil: not readable here
	nextSweep atomic.Int64       // Unix nanoseconds: no sweep before
	fullTimes atomic.Int64       // Accepts that found no place free

	mu    sync.Mutex
	conns map[*placeConn]struct{} // open: changes per connection, not per request
}

func newBoundedListener(ln net.Listener, n int) *boundedListener {
	return &boundedListener{Listener: ln, places: make(chan struct{}, n), done: make(chan struct{}),
		grace: idleGrace, queue: listenQueue(ln), conns: map[*placeConn]struct{}{}}
}

func (l *boundedListener) Accept() (net.Conn, error) {
	select {
	case l.places <- struct{}{}:
	default:
		if err := l.waitForPlace(); err != nil {
			return nil, err
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.places
		return nil, err
	}
	l.open.Add(1)
	pc := &placeConn{Conn: c}
	pc.release = func() {
		l.mu.Lock()
		delete(l.conns, pc)
		l.mu.Unlock()
		l.open.Add(-1)
		<-l.places
	}
	l.mu.Lock()
	l.conns[pc] = struct{}{}
	l.mu.Unlock()
	return pc, nil
}

// waitForPlace waits for a connection to close, sweeping idle ones out
// meanwhile, at most once per grace whatever the number of Accepts that
// wait: at the bound one does for every connection taken in.
func (l *boundedListener) waitForPlace() error {
	l.fullTimes.Add(1)
	t := time.NewTimer(time.Duration(max(0, l.nextSweep.Load()-time.Now().UnixNano())))
	defer t.Stop()
	for {
		select {
		case l.places <- struct{}{}:
			return nil
		case <-l.done:
			return net.ErrClosed
		case <-t.C:
			now := time.Now()
			if next := l.nextSweep.Load(); now.UnixNano() >= next && l.nextSweep.CompareAndSwap(next, now.Add(l.grace).UnixNano()) {
				l.closeIdle(drainIdle, now.Add(-l.grace))
			}
			t.Reset(time.Duration(max(0, l.nextSweep.Load()-time.Now().UnixNano())))
		}
	}
}

func (l *boundedListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// full: as many connections are open as the bound allows (false without a
// bound).
func (l *boundedListener) full() bool {
	return l != nil && l.open.Load() >= int64(cap(l.places))
}

// connState is the http.Server's ConnState hook: it marks when each
// connection turned idle, with no lock (it runs twice a request).
func (l *boundedListener) connState(c net.Conn, st http.ConnState) {
	pc, ok := c.(*placeConn)
	if !ok {
		return
	}
	var since int64
	if st == http.StateIdle {
		since = time.Now().UnixNano()
	}
	pc.idleSince.Store(since)
}

// closeIdle closes up to n connections idle since before, among up to
// sweepScan of them. A client that sends a request on one just then gets no
// answer, as at any idle timeout; a reservation it sends again with the
// same idempotency key is answered once.
func (l *boundedListener) closeIdle(n int, before time.Time) {
	l.mu.Lock()
	var picked []*placeConn
	seen := 0
	for pc := range l.conns {
		if len(picked) == n || seen == sweepScan {
			break
		}
		seen++
		if since := pc.idleSince.Load(); since > 0 && since < before.UnixNano() {
			picked = append(picked, pc)
		}
	}
	l.mu.Unlock()
	for _, pc := range picked {
		_ = pc.Close()
	}
}

// connectionGauges report the buyers' connections and their bound (0
// without one).
func (s *Server) connectionGauges() []prometheus.Collector {
	read := func(v func(l *boundedListener) int64) func() float64 {
		return func() float64 {
			if l := s.conns.Load(); l != nil {
				return float64(v(l))
			}
			return 0
		}
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashsale_api_connections",
			Help: "Connections open to the API's port, when they are bounded (flashsale_api_connections_max > 0).",
		}, read(func(l *boundedListener) int64 { return l.open.Load() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "flashsale_api_connections_full_total",
			Help: "Times the API's port had no place for the next connection (at the bound, about once per connection taken in).",
		}, read(func(l *boundedListener) int64 { return l.fullTimes.Load() })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashsale_api_connections_waiting",
			Help: "Connections the kernel has taken on the API's port and the process has not accepted yet, when they are bounded (NaN where the kernel does not tell).",
		}, func() float64 {
			l := s.conns.Load()
			if l == nil {
				return 0
			}
			if l.queue != nil {
				if n, ok := l.queue(); ok {
					return float64(n)
				}
			}
			return math.NaN()
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashsale_api_connections_max",
			Help: "The most connections the API's port holds at once, the open-file limit less the process's own share (0: no bound); at it each answer closes its connection and the next buyers wait in the kernel's listen queue.",
		}, func() float64 { return float64(max(s.cfg.MaxConnections, 0)) }),
	}
}

// placeConn gives its place back once, on its first Close.
type placeConn struct {
	net.Conn
	once      sync.Once
	release   func()
	idleSince atomic.Int64 // Unix nanoseconds; 0 while not idle
}

func (c *placeConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite lets net/http half-close the connection before closing it, so
// that an answer is not lost to a reset when the request's body was not read.
func (c *placeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
