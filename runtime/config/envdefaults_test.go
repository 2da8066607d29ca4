package config

import (
	"strings"
	"testing"
	"time"
)

// TestEnvDefaults: a set variable is the default, an unset or empty one
// leaves the default, and each malformed one is kept as an error naming the
// variable and its value, the default standing meanwhile.
func TestEnvDefaults(t *testing.T) {
	t.Setenv("T_INT", "7")
	t.Setenv("T_DUR", "90s")
	t.Setenv("T_FLOAT", "2.5")
	t.Setenv("T_EMPTY", "")
	t.Setenv("T_BAD_INT", "seven")
	t.Setenv("T_BAD_DUR", "10")
	t.Setenv("T_U64", "18446744073709551615")
	t.Setenv("T_BAD_U64", "-1")
	var e EnvDefaults
	if got := e.Int("T_INT", 1); got != 7 {
		t.Errorf("Int = %d, want 7", got)
	}
	if got := e.Duration("T_DUR", time.Second); got != 90*time.Second {
		t.Errorf("Duration = %s, want 1m30s", got)
	}
	if got := e.Float("T_FLOAT", 1); got != 2.5 {
		t.Errorf("Float = %g, want 2.5", got)
	}
	if got := e.Uint64("T_U64", 1); got != 1<<64-1 {
		t.Errorf("Uint64 = %d, want 2^64-1", got)
	}
	if got := e.Int("T_EMPTY", 3); got != 3 {
		t.Errorf("Int of an empty variable = %d, want the default 3", got)
	}
	if got := e.Int("T_UNSET_NEVER", 4); got != 4 {
		t.Errorf("Int of an unset variable = %d, want the default 4", got)
	}
	if err := e.Err(); err != nil {
		t.Fatalf("no malformed value read yet: %v", err)
	}
	if got := e.Int("T_BAD_INT", 5); got != 5 {
		t.Errorf("Int of a malformed variable = %d, want the default 5", got)
	}
	if got := e.Duration("T_BAD_DUR", time.Minute); got != time.Minute {
		t.Errorf("Duration of a malformed variable = %s, want the default", got)
	}
	if got := e.Uint64("T_BAD_U64", 6); got != 6 {
		t.Errorf("Uint64 of a malformed variable = %d, want the default 6", got)
	}
	err := e.Err()
	if err == nil {
		t.Fatal("three malformed values, no error")
	}
	for _, want := range []string{`T_BAD_INT="seven" is not an integer`, `T_BAD_DUR="10" is not a duration`, `T_BAD_U64="-1" is not an unsigned 64-bit integer`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
