package testharness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := CloseAll(); err != nil {
		fmt.Fprintln(os.Stderr, "CloseAll:", err)
		code = 1
	}
	// Every server closed by its test or by CloseAll must have removed its directory.
	left, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+strconv.Itoa(os.Getpid())+"-*"))
	if len(left) > 0 {
		fmt.Fprintln(os.Stderr, "temporary directories left behind:", left)
		code = 1
	}
	os.Exit(code)
}
