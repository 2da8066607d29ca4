package testharness

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// keptRuns is how many failed runs' logs LogArchive holds; older ones go.
const keptRuns = 5

// LogArchive is where KeepLogs puts a failed run's logs:
// $FLASHSALE_TEST_LOGS, or test-logs under the project's cache
// ($FLASHSALE_CACHE, or $XDG_CACHE_HOME/flashsale-operator, or
// ~/.cache/flashsale-operator, as the hack scripts resolve it).
func LogArchive() (string, error) {
	if d := os.Getenv("FLASHSALE_TEST_LOGS"); d != "" {
		return d, nil
	}
	if d := os.Getenv("FLASHSALE_CACHE"); d != "" {
		return filepath.Join(d, "test-logs"), nil
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no place for test logs: %w", err)
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "flashsale-operator", "test-logs"), nil
}

// KeepLogs copies the log files (*.log) below dirs, below this process's
// harness directories in the temporary directory (its servers) and below
// the directories of its nodes that are up (wherever they are: see
// StartCluster), into a new folder of LogArchive named for the time, kind
// and this process, and returns that folder. A run's own directories are
// swept by the next run once this process is gone; the archive is not, so a
// failure can be read after later runs. The archive keeps the newest
// keptRuns folders.
func KeepLogs(kind string, dirs ...string) (string, error) {
	root, err := LogArchive()
	if err != nil {
		return "", err
	}
	own, _ := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-*", tempPrefix, os.Getpid())))
	dirs = append(dirs, own...)
	dirs = append(dirs, openNodeDirs()...)
	// The time first, so that the names sort by it.
	dest := filepath.Join(root, fmt.Sprintf("%s-%s-%d", time.Now().UTC().Format("20060102T150405.000000000Z"), kind, os.Getpid()))
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return "", err
	}
	for _, dir := range outermost(dirs) {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil // a server's file removed while we walk
			}
			if !d.Type().IsRegular() || !strings.HasSuffix(d.Name(), ".log") {
				return nil
			}
			rel, err := filepath.Rel(filepath.Dir(dir), path)
			if err != nil {
				return err
			}
			return copyFile(path, filepath.Join(dest, rel))
		})
		if err != nil {
			return dest, err
		}
	}
	return dest, pruneArchive(root)
}

// outermost returns dirs without repeats and without those below another
// of them (a run's servers below its TMPDIR), so each log is copied once.
func outermost(dirs []string) []string {
	clean := make([]string, len(dirs))
	for i, d := range dirs {
		clean[i] = filepath.Clean(d)
	}
	sort.Strings(clean) // an ancestor sorts before what is below it
	var out []string
	for _, d := range clean {
		if !slices.ContainsFunc(out, func(o string) bool {
			return d == o || strings.HasPrefix(d, o+string(filepath.Separator))
		}) {
			out = append(out, d)
		}
	}
	return out
}

// openNodeDirs returns the directories of this process's nodes that are up.
// A node lives below /tmp when the temporary directory is too long for its
// sockets, as it is below an environment that points TMPDIR into its own
// directory, so the glob of the temporary directory misses it.
func openNodeDirs() []string {
	registry.Lock()
	defer registry.Unlock()
	var dirs []string
	for c := range registry.open {
		if n, ok := c.(*Cluster); ok && n.Dir != "" {
			dirs = append(dirs, n.Dir)
		}
	}
	return dirs
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return nil // gone since the walk saw it
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	dst, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		_ = dst.Close()
		return err
	}
	return dst.Close()
}

// pruneArchive removes all but the newest keptRuns folders.
func pruneArchive(root string) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	for _, name := range names[min(len(names), keptRuns):] {
		if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
			return err
		}
	}
	return nil
}
