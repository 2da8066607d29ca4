package storm

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// Transport is a keep-alive HTTP/1.1 transport that writes each request and
// reads its answer on the calling goroutine. net/http's Transport gives every
// connection a reader and a writer goroutine and hands each request between
// them; a storm client sharing the machine with the server it measures spent
// about as much CPU on those hand-offs as the server spent answering.
//
// Only plain http:// requests without a proxy take this path; https and proxied
// requests go to Fallback. Like net/http, a request is sent again on a new
// connection only when its reused idle connection turns out closed before any
// answer arrived (the server closed it while idle) and the request may be
// replayed: GET, HEAD, OPTIONS, TRACE, or one with an Idempotency-Key header.
// A POST that got no answer is the caller's to retry, as the storm does with
// the same idempotency key, counting the lost answer.
type Transport struct {
	// MaxIdlePerHost bounds the idle connections kept per host; default 64.
	MaxIdlePerHost int
	// DialTimeout bounds connecting; default 5s. The request's context
	// deadline (http.Client.Timeout sets one) bounds the rest.
	DialTimeout time.Duration
	// Fallback serves https and proxied requests; default a clone of
	// http.DefaultTransport keeping MaxIdlePerHost idle connections per host.
	Fallback http.RoundTripper

	once     sync.Once
	dialer   net.Dialer
	mu       sync.Mutex
	idle     map[string][]*conn // host:port -> idle connections, most recent last
	direct   map[string]bool    // host:port -> no proxy configured for it
	fallback http.RoundTripper
}

type conn struct {
	nc net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func (t *Transport) init() {
	t.once.Do(func() {
		if t.MaxIdlePerHost <= 0 {
			t.MaxIdlePerHost = 64
		}
		if t.DialTimeout <= 0 {
			t.DialTimeout = 5 * time.Second
		}
		t.dialer = net.Dialer{Timeout: t.DialTimeout, KeepAlive: 30 * time.Second}
		t.fallback = t.Fallback
		if t.fallback == nil {
			// The default keeps 2 idle connections per host: a storm over
			// https would reconnect (a TLS handshake) on most requests.
			ht := http.DefaultTransport.(*http.Transport).Clone()
			ht.MaxIdleConnsPerHost = t.MaxIdlePerHost
			t.fallback = ht
		}
		t.idle = map[string][]*conn{}
		t.direct = map[string]bool{}
	})
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.init()
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		return t.fallback.RoundTrip(req)
	}
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	if !t.isDirect(req, addr) {
		return t.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		c, reused := t.get(addr)
		if c == nil {
			nc, err := t.dialer.DialContext(ctx, "tcp", addr)
			if err != nil {
				closeRequestBody(req)
				return nil, err
			}
			c = &conn{nc: nc, br: bufio.NewReaderSize(nc, 4096), bw: bufio.NewWriterSize(nc, 4096)}
		}
		resp, sentNothing, err := t.send(ctx, c, req, addr)
		if err == nil {
			return resp, nil
		}
		c.nc.Close()
		if !reused || !sentNothing || attempt > 0 || !replayable(req) {
			return nil, err
		}
		if req.Body != nil && req.Body != http.NoBody {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			req = req.Clone(ctx)
			req.Body = body
		}
	}
}

// send writes req on c and reads the answer's head. sentNothing reports an
// error before the first byte of an answer on a connection the peer had
// already closed: the request can go again on a new connection.
func (t *Transport) send(ctx context.Context, c *conn, req *http.Request, addr string) (resp *http.Response, sentNothing bool, err error) {
	if err := ctx.Err(); err != nil {
		closeRequestBody(req)
		return nil, false, err
	}
	deadline, _ := ctx.Deadline() // zero: none
	if err := c.nc.SetDeadline(deadline); err != nil {
		closeRequestBody(req)
		return nil, false, err
	}
	// A cancelled context ends the wait at once, as in net/http.
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	if err := req.Write(c.bw); err != nil {
		stop()
		return nil, closedByPeer(err), err
	}
	if err := c.bw.Flush(); err != nil {
		stop()
		return nil, closedByPeer(err), err
	}
	if _, err := c.br.Peek(1); err != nil {
		stop()
		return nil, closedByPeer(err), err
	}
	resp, err = http.ReadResponse(c.br, req)
	if err != nil {
		stop()
		return nil, false, err
	}
	resp.Body = &body{ReadCloser: resp.Body, t: t, c: c, addr: addr, keep: !resp.Close && !req.Close, stop: stop}
	return resp, false, nil
}

// replayable tells a request that may be sent twice (net/http's rule).
func replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
}

// closedByPeer tells an error of a connection the server had closed.
func closedByPeer(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// isDirect tells whether no proxy is configured for addr (asked once per host).
func (t *Transport) isDirect(req *http.Request, addr string) bool {
	t.mu.Lock()
	d, ok := t.direct[addr]
	t.mu.Unlock()
	if ok {
		return d
	}
	proxy, err := http.ProxyFromEnvironment(req)
	d = err == nil && proxy == nil
	t.mu.Lock()
	t.direct[addr] = d
	t.mu.Unlock()
	return d
}

func (t *Transport) get(addr string) (*conn, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cs := t.idle[addr]
	if len(cs) == 0 {
		return nil, false
	}
	c := cs[len(cs)-1]
	cs[len(cs)-1] = nil
	t.idle[addr] = cs[:len(cs)-1]
	return c, true
}

func (t *Transport) put(addr string, c *conn) {
	t.mu.Lock()
	if cs := t.idle[addr]; len(cs) < t.MaxIdlePerHost {
		t.idle[addr] = append(cs, c)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	c.nc.Close()
}

// CloseIdleConnections closes the idle connections (http.Client calls it).
func (t *Transport) CloseIdleConnections() {
	t.init()
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]*conn{}
	t.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.nc.Close()
		}
	}
	if ci, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// body returns its connection to the idle pool once the answer was read to
// its end; a connection whose answer was not read to the end is closed.
type body struct {
	io.ReadCloser
	t    *Transport
	c    *conn
	addr string
	keep bool
	stop func() bool
	done bool
}

func (b *body) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.finish(true)
	} else if err != nil {
		b.finish(false)
	}
	return n, err
}

// Close drains a small rest (an answer nobody read, such as an empty one) so
// that the connection can be reused.
func (b *body) Close() error {
	if b.done {
		return nil
	}
	_, err := io.Copy(io.Discard, io.LimitReader(b.ReadCloser, 4096))
	var probe [1]byte
	n, perr := b.ReadCloser.Read(probe[:])
	b.finish(err == nil && n == 0 && perr == io.EOF)
	return nil
}

func (b *body) finish(reusable bool) {
	b.done = true
	if !b.stop() {
		reusable = false // the context ended: the deadline is spoilt
	}
	if reusable && b.keep {
		b.t.put(b.addr, b.c)
		return
	}
	b.c.nc.Close()
}

func closeRequestBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
