package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A demo directory whose pid file names a live process is refused only when
// the process is the one that wrote it (same start time), not another process
// that got the pid since.
func TestPrepareDirTellsAReusedPid(t *testing.T) {
	started, ok := processStart(1)
	if !ok {
		t.Fatal("no start time for pid 1")
	}
	dir := filepath.Join(t.TempDir(), "demo")
	for _, tc := range []struct {
		pidFile string
		refused bool
	}{
		{"1 " + started + "\n", true},          // the demo that wrote it still runs
		{"1 " + started + "0\n", false},        // pid 1 is another process now
		{"1\n", true},                          // an older pid file: the pid alone decides
		{"999999999 " + started + "\n", false}, // gone
	} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "demo.pid"), []byte(tc.pidFile), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := prepareDir(dir)
		if refused := err != nil && strings.Contains(err.Error(), "another demo"); refused != tc.refused {
			t.Fatalf("pid file %q: %v, want refused %v", tc.pidFile, err, tc.refused)
		}
		if !tc.refused {
			b, err := os.ReadFile(filepath.Join(dir, "demo.pid"))
			self, _ := processStart(os.Getpid())
			if err != nil || string(b) != strconv.Itoa(os.Getpid())+" "+self+"\n" {
				t.Fatalf("new pid file %q, %v", b, err)
			}
		}
	}
}

// A directory with files and no demo.pid is no demo's: it is refused and
// left as it was. An empty one is taken.
func TestPrepareDirLeavesOtherDirectories(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "go.mod")
	if err := os.WriteFile(keep, []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := prepareDir(dir); err == nil || !strings.Contains(err.Error(), "no demo.pid") {
		t.Fatalf("a directory of other files: %v, want refused", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("the refused directory lost its file: %v", err)
	}
	empty := t.TempDir()
	if _, err := prepareDir(empty); err != nil {
		t.Fatalf("an empty directory: %v", err)
	}
}
