package podrunner

import (
	"strings"
	"testing"
)

func TestAdminListensOnLoopbackOnly(t *testing.T) {
	for addr, wantErr := range map[string]string{
		"127.0.0.1:0":   "",
		"[::1]:0":       "",
		":0":            "only a loopback IP address",
		"0.0.0.0:0":     "only a loopback IP address",
		"localhost:0":   "only a loopback IP address",
		"127.0.0.1":     "missing port",
		"10.1.2.3:8080": "only a loopback IP address",
	} {
		ln, err := listenLoopback(addr)
		if wantErr == "" {
			if err != nil {
				// An IPv6-less machine cannot listen on ::1; that says nothing here.
				if strings.Contains(addr, "::1") {
					continue
				}
				t.Errorf("%s: %v", addr, err)
				continue
			}
			ln.Close()
			continue
		}
		if err == nil {
			ln.Close()
			t.Errorf("%s: listening succeeded, want an error containing %q", addr, wantErr)
		} else if !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: %v, want an error containing %q", addr, err, wantErr)
		}
	}
}
