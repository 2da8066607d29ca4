package testharness

import (
	"io"
	"net"
	"sync"
	"testing"
)

// SilentServer accepts TCP connections on 127.0.0.1 and never answers: a
// server that hangs (a PostgreSQL host behind a dropped route, a stuck
// proxy). It is closed, with its connections, when the test ends.
type SilentServer struct {
	ln       net.Listener
	Accepted chan struct{} // one value per connection accepted
	// FirstClosed is closed when the client closes the first connection.
	FirstClosed chan struct{}

	mu    sync.Mutex
	conns []net.Conn
}

// StartSilentServer starts one for the test.
func StartSilentServer(t testing.TB) *SilentServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &SilentServer{ln: ln, Accepted: make(chan struct{}, 64), FirstClosed: make(chan struct{})}
	go s.serve()
	t.Cleanup(s.close)
	return s
}

// Addr is host:port.
func (s *SilentServer) Addr() string { return s.ln.Addr().String() }

func (s *SilentServer) serve() {
	first := true
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		select {
		case s.Accepted <- struct{}{}:
		default:
		}
		go func(c net.Conn, first bool) {
			_, _ = io.Copy(io.Discard, c) // until the client closes it
			if first {
				close(s.FirstClosed)
			}
		}(c, first)
		first = false
	}
}

func (s *SilentServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		_ = c.Close()
	}
}
