package testharness

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLeftForCloseAll starts an API server and a shared directory and leaves
// them running, as a package's TestMain setup does: CloseAll in TestMain must
// stop the one and remove the other, or TestMain finds their directories left
// behind and fails.
func TestLeftForCloseAll(t *testing.T) {
	dir, err := TempDir("shared")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "flashsale"), []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	k, err := StartKube()
	if err != nil {
		t.Fatal(err)
	}
	registry.Lock()
	defer registry.Unlock()
	for name, c := range map[string]closer{"the API server": k, "the directory": tempDirCloser(dir)} {
		if !registry.open[c] {
			t.Errorf("%s is not registered: CloseAll would leave it", name)
		}
	}
}
