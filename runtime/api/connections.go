package api

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A full listener closes up to drainIdle kept-alive connections that have
// been idle for idleGrace or more, every idleGrace while it has no place for
// the next connection. A connection idle for less is between a buyer's
// requests: closing it would lose the next one, which is on its way.
const (
	drainIdle = 16
	idleGrace = time.Second
)

// boundedListener accepts at most n connections open at once: past them it
// accepts none until one closes, and the next wait in the kernel's listen
// queue. The process keeps so the files its own connections to Redis and
// the ledger, and its metrics listener (where the kubelet probes it), need.
//
// A connection must not hold its place for nothing while others wait: at the
// bound each answer closes its connection (Server.closeWhenDraining), and
// while no place is free the listener closes the connections that sit idle,
// as a kept-alive connection's idle timeout would, only sooner.
type boundedListener struct {
	net.Listener
	places chan struct{} // a token per open connection, and one for the Accept waiting
	open   atomic.Int64  // connections accepted and not yet closed
	done   chan struct{} // closed by Close: a waiting Accept returns
	once   sync.Once

	mu    sync.Mutex
	conns map[*placeConn]struct{} // open: changes per connection, not per request
}

func newBoundedListener(ln net.Listener, n int) *boundedListener {
	return &boundedListener{Listener: ln, places: make(chan struct{}, n), done: make(chan struct{}), conns: map[*placeConn]struct{}{}}
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

// waitForPlace waits for a connection to close, closing idle ones meanwhile.
func (l *boundedListener) waitForPlace() error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case l.places <- struct{}{}:
			return nil
		case <-l.done:
			return net.ErrClosed
		case <-t.C:
			l.closeIdle(drainIdle, time.Now().Add(-idleGrace))
			t.Reset(idleGrace)
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

// closeIdle closes up to n connections idle since before. A client that
// sends a request on one just then gets no answer, as at any idle timeout;
// a reservation it sends again with the same idempotency key is answered
// once.
func (l *boundedListener) closeIdle(n int, before time.Time) {
	l.mu.Lock()
	var picked []*placeConn
	for pc := range l.conns {
		if len(picked) == n {
			break
		}
		if since := pc.idleSince.Load(); since > 0 && since < before.UnixNano() {
			picked = append(picked, pc)
		}
	}
	l.mu.Unlock()
	for _, pc := range picked {
		_ = pc.Close()
	}
}

// gauges report the buyers' connections and their bound (0 without one).
func (s *Server) connectionGauges() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashsale_api_connections",
			Help: "Connections open to the API's port, when they are bounded (flashsale_api_connections_max > 0).",
		}, func() float64 {
			if l := s.conns.Load(); l != nil {
				return float64(l.open.Load())
			}
			return 0
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
