package main

import (
	"os"
	"strings"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// The one-hash variant is made from the product's reserve.lua: when the lines
// it replaces change, this fails here rather than in the middle of make bench.
func TestPackedVariantFollowsReserveLua(t *testing.T) {
	src, err := os.ReadFile(repoPath(testharness.RepoRoot(), "runtime", "stock", "scripts", "reserve.lua"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := packedReserveScript(string(src)); err != nil {
		t.Fatalf("the variant no longer applies to reserve.lua: %v", err)
	}
	edited := strings.Replace(string(src), "redis.call('PERSIST', KEYS[4])", "redis.call('PERSIST', KEYS[4], 0)", 1)
	if _, err := packedReserveScript(edited); err == nil || !strings.Contains(err.Error(), "reserve.lua changed") {
		t.Fatalf("a body without the replaced lines: err %v, want the change named", err)
	}
}
