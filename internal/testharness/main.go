package testharness

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// Main is a test binary's TestMain: it runs setup (which starts the shared
// servers), then the tests, then CloseAll, and exits. Whatever setup started
// before failing is closed too. The exit code is the tests', or 1 when setup
// or closing failed.
func Main(m *testing.M, setup func() error) {
	code := 1
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "test setup:", err)
	} else {
		code = m.Run()
	}
	if err := CloseAll(); err != nil {
		fmt.Fprintln(os.Stderr, "closing test servers:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

// TempDir makes a directory that CloseAll removes, for files a whole test
// binary shares (a built binary). A binary killed before CloseAll leaves it to
// the next run's sweep of stale directories.
func TempDir(kind string) (string, error) {
	dir, err := tempDir(kind)
	if err != nil {
		return "", err
	}
	register(tempDirCloser(dir))
	return dir, nil
}

// RunDir makes a directory named for this process that the caller removes
// (or keeps, for a failed run's logs). Once this process is gone, the next
// run's sweep of stale directories removes it, so runs that were killed, or
// kept their logs, do not pile up.
func RunDir(kind string) (string, error) { return tempDir(kind) }

type tempDirCloser string

func (d tempDirCloser) Close() error {
	unregister(d)
	return os.RemoveAll(string(d))
}

// Eventually polls cond until it holds, and fails the test when timeout
// passes first, naming what it waited for.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
