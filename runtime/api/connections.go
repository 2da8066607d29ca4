package api

import (
	"net"
	"sync"
	"sync/atomic"
)

// boundedListener accepts at most n connections open at once: past them it
// accepts none until one closes, and the next wait in the kernel's listen
// queue. A process whose open-file limit cannot hold a socket for every
// buyer it takes in keeps so the files its own connections to Redis and the
// ledger need; the kubelet's probes go to the metrics listener, not here.
type boundedListener struct {
	net.Listener
	places chan struct{} // a token per open connection, and one for the Accept waiting
	open   atomic.Int64  // connections accepted and not yet closed
	done   chan struct{} // closed by Close: a waiting Accept returns
	once   sync.Once
}

func newBoundedListener(ln net.Listener, n int) *boundedListener {
	return &boundedListener{Listener: ln, places: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *boundedListener) Accept() (net.Conn, error) {
	select {
	case l.places <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.places
		return nil, err
	}
	l.open.Add(1)
	return &placeConn{Conn: c, release: func() { l.open.Add(-1); <-l.places }}, nil
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

// placeConn gives its place back once, on its first Close.
type placeConn struct {
	net.Conn
	once    sync.Once
	release func()
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
