//go:build !linux

package api

import "net"

// listenQueue: only Linux reports a listener's accept queue; elsewhere
// flashsale_api_connections_waiting reads NaN.
func listenQueue(net.Listener) func() (int, bool) { return nil }
