package testharness

import (
	"testing"
	"time"
)

func TestBeforeTimeoutStopsThenExits(t *testing.T) {
	stopped, exited := make(chan struct{}), make(chan int, 1)
	beforeTimeout(300*time.Millisecond, 100*time.Millisecond, func() { close(stopped) }, func(code int) {
		select {
		case <-stopped:
		default:
			t.Error("exited before stopping")
		}
		exited <- code
	})
	select {
	case code := <-exited:
		if code != 1 {
			t.Fatalf("exit status %d, want 1", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("neither stopped nor exited")
	}
}

func TestBeforeTimeoutCancelledOrWithoutALimitDoesNothing(t *testing.T) {
	fired := make(chan struct{}, 2)
	fire := func() { fired <- struct{}{} }
	cancel := beforeTimeout(50*time.Millisecond, 10*time.Millisecond, fire, func(int) {})
	cancel()
	beforeTimeout(0, 0, fire, func(int) {})() // -test.timeout 0: no limit
	// The cancelled timer was due at 40 ms.
	time.Sleep(200 * time.Millisecond)
	select {
	case <-fired:
		t.Fatal("stop ran after cancel, or without a limit")
	default:
	}
}

// The tests ending while the stop runs wait for it to exit the process.
func TestBeforeTimeoutCancelDuringTheStopWaitsForIt(t *testing.T) {
	stopping, release, exited := make(chan struct{}), make(chan struct{}), make(chan struct{})
	cancel := beforeTimeout(20*time.Millisecond, 10*time.Millisecond, func() {
		close(stopping)
		<-release
	}, func(int) { close(exited) })
	<-stopping
	returned := make(chan struct{})
	go func() { cancel(); close(returned) }() // blocks for ever: left behind
	close(release)
	<-exited
	select {
	case <-returned:
		t.Fatal("cancel returned while the stop was exiting the process")
	case <-time.After(100 * time.Millisecond):
	}
}
