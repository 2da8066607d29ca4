package testharness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeepLogs(t *testing.T) {
	archive := t.TempDir()
	t.Setenv("FLASHSALE_TEST_LOGS", archive)
	run := filepath.Join(t.TempDir(), "run")
	t.Setenv("TMPDIR", t.TempDir()) // none of this process's servers' logs
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(run, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("env/logs/operator.log", "reconciled\n")
	write("env/tmp/redis-1/redis.log", "ready\n")
	write("env/images/flashsale", "a binary, not a log")
	if err := os.Symlink("operator.log", filepath.Join(run, "env/logs/link.log")); err != nil {
		t.Fatal(err)
	}

	kept, err := KeepLogs("e2e", run, run) // a directory named twice is copied once
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(kept) != archive || !strings.Contains(filepath.Base(kept), "-e2e-") {
		t.Fatalf("kept in %s, want a folder of %s named for the run", kept, archive)
	}
	var got []string
	_ = filepath.WalkDir(kept, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(kept, p)
			got = append(got, rel)
		}
		return nil
	})
	want := []string{"run/env/logs/operator.log", "run/env/tmp/redis-1/redis.log"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("kept %v, want %v (logs only, no links, no binaries)", got, want)
	}
	if b, _ := os.ReadFile(filepath.Join(kept, want[0])); string(b) != "reconciled\n" {
		t.Fatalf("kept operator.log holds %q", b)
	}

	// The archive keeps the newest runs only; the run's own files stay.
	var all []string
	for range keptRuns + 2 {
		k, err := KeepLogs("node-e2e", run)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, filepath.Base(k))
	}
	entries, err := os.ReadDir(archive)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if strings.Join(left, " ") != strings.Join(all[len(all)-keptRuns:], " ") {
		t.Fatalf("archive holds %v, want the newest %d: %v", left, keptRuns, all[len(all)-keptRuns:])
	}
	if _, err := os.Stat(filepath.Join(run, "env/logs/operator.log")); err != nil {
		t.Fatalf("the run's own log: %v", err)
	}
}

func TestLogArchiveFollowsTheCacheRoot(t *testing.T) {
	t.Setenv("FLASHSALE_TEST_LOGS", "")
	t.Setenv("FLASHSALE_CACHE", "/var/cache/fs")
	if d, _ := LogArchive(); d != "/var/cache/fs/test-logs" {
		t.Fatalf("with FLASHSALE_CACHE: %s", d)
	}
	t.Setenv("FLASHSALE_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if d, _ := LogArchive(); d != "/xdg/flashsale-operator/test-logs" {
		t.Fatalf("with XDG_CACHE_HOME: %s", d)
	}
}

// A node below an environment that points TMPDIR into its own directory
// lives in /tmp, outside that TMPDIR (StartCluster): its components' and
// pods' logs are kept all the same.
func TestKeepLogsHoldsTheLogsOfANodeOutsideTheTemporaryDirectory(t *testing.T) {
	t.Setenv("FLASHSALE_TEST_LOGS", t.TempDir())
	t.Setenv("TMPDIR", t.TempDir())
	node := &Cluster{Dir: filepath.Join(t.TempDir(), "node")}
	for rel, text := range map[string]string{
		"logs/kubelet.log": "node Ready\n",
		"pod-logs/flashsale-system_manager-1_uid/manager/0.log": "reconciled\n",
	} {
		p := filepath.Join(node.Dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	register(node)
	kept, err := KeepLogs("node")
	unregister(node)
	if err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]string{
		"node/logs/kubelet.log": "node Ready\n",
		"node/pod-logs/flashsale-system_manager-1_uid/manager/0.log": "reconciled\n",
	} {
		if b, err := os.ReadFile(filepath.Join(kept, rel)); err != nil || string(b) != want {
			t.Errorf("kept %s: %q, %v; want %q", rel, b, err, want)
		}
	}

	// A node that is stopped is no longer looked at.
	kept, err = KeepLogs("node")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(kept, "node")); !os.IsNotExist(err) {
		t.Fatalf("a stopped node's logs kept: %v", err)
	}
}

func TestOutermostKeepsEachDirectoryOnce(t *testing.T) {
	got := outermost([]string{"/t/run/env/tmp/redis-1", "/t/run-2", "/t/run/", "/t/run", "/t/run-2/x", "/t/run/env/tmp/pg-1", "/t/other"})
	want := []string{"/t/other", "/t/run", "/t/run-2"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("outermost = %v, want %v", got, want)
	}
}
