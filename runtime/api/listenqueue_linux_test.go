package api

import (
	"net"
	"testing"
	"time"
)

// The kernel's accept queue is read as the connections it completed that
// the process has not accepted: those dialled, less those accepted.
func TestListenQueueCountsConnectionsNotAccepted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if !queueVisible() {
		t.Skip("this kernel does not report a listener's accept queue (a sandbox's): the gauge reads NaN")
	}
	read := listenQueue(ln)
	if read == nil {
		t.Fatal("the accept queue of a TCP listener on Linux is not readable")
	}
	queued := func() int {
		n, ok := read()
		if !ok {
			t.Fatal("reading the accept queue failed")
		}
		return n
	}
	if n := queued(); n != 0 {
		t.Fatalf("%d queued before any dial", n)
	}
	for i := range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		waitFor(t, "the dialled connection queued", func() bool { return queued() == i+1 })
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := queued(); n != 2 {
		t.Fatalf("%d queued after one of three accepted, want 2", n)
	}
	if listenQueue(fakeListener{ln}) != nil {
		t.Error("a listener that is no TCP listener got a reader")
	}
}

type fakeListener struct{ net.Listener }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}
