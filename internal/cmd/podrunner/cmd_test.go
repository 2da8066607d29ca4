package podrunner

import (
	"io"
	"os"
	"path/filepath"
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

// TestBinaryIsRequired: the runner is its own executable, not flashsale, so
// without --binary it would start itself as every replica. It refuses, and
// starts nothing (no directory, no listener).
func TestBinaryIsRequired(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runner")
	cmd := NewCmd()
	cmd.SetArgs([]string{"--dir", dir, "--admin-listen", "127.0.0.1:0"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "--binary is required") {
		t.Fatalf("podrunner without --binary: %v, want an error naming --binary", err)
	}
	if _, statErr := os.Stat(dir); !os.IsNotExist(statErr) {
		t.Errorf("podrunner without --binary made %s (%v)", dir, statErr)
	}
}
