//go:build linux

package api

import (
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// tcpListen is TCP_LISTEN in the kernel's tcp_states.h.
const tcpListen = 10

// listenQueue returns a reader of ln's accept queue: the connections the
// kernel has completed and the process has not accepted yet. Linux gives
// its length in the unacked field of a listening socket's TCP_INFO. nil
// when ln is no TCP listener, or where the kernel does not report it (a
// sandboxed kernel may answer 0 whatever waits: queueVisible checks).
func listenQueue(ln net.Listener) func() (int, bool) {
	tl, ok := ln.(*net.TCPListener)
	if !ok || !queueVisible() {
		return nil
	}
	return readQueue(tl)
}

func readQueue(tl *net.TCPListener) func() (int, bool) {
	rc, err := tl.SyscallConn()
	if err != nil {
		return nil
	}
	return func() (int, bool) {
		n, ok := 0, false
		_ = rc.Control(func(fd uintptr) {
			info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
			if err == nil && info.State == tcpListen {
				n, ok = int(info.Unacked), true
			}
		})
		return n, ok
	}
}

// queueVisible tries the reading once per process on a listener of its
// own: a connection dialled and not accepted must show.
var queueVisible = sync.OnceValue(func() bool {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return false
	}
	defer ln.Close()
	read := readQueue(ln)
	if read == nil {
		return false
	}
	if n, ok := read(); !ok || n != 0 {
		return false
	}
	c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	// The handshake completes on the loopback as the dial returns; the
	// wait is for a kernel that queues it a moment later.
	for range 100 {
		if n, ok := read(); ok && n >= 1 {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return false
})
