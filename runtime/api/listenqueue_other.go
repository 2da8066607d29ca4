//go:build !linux

package api

import "net"

// listenQueue: only Linux reports a listener's accept queue; elsewhere the
// bounded listener assumes that a buyer waits whenever it is full.
func listenQueue(net.Listener) func() (int, bool) { return nil }
