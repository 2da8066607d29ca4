package testharness

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// InfoField is the value of field in a section of c's INFO ("" when absent).
func InfoField(t testing.TB, c redis.UniversalClient, section, field string) string {
	t.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// RunID is the run_id of the standalone server c talks to.
func RunID(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	id := InfoField(t, c, "server", "run_id")
	if id == "" {
		t.Fatal("no run_id in INFO server")
	}
	return id
}

// ScriptRuns is how many script calls the server c talks to ran since CONFIG
// RESETSTAT: calls less failed calls of EVAL and EVALSHA (INFO commandstats).
func ScriptRuns(t testing.TB, c redis.UniversalClient) int {
	t.Helper()
	total := 0
	for _, cmd := range []string{"cmdstat_eval", "cmdstat_evalsha"} {
		var calls, failed int
		for _, kv := range strings.Split(InfoField(t, c, "commandstats", cmd), ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "calls":
				calls = n
			case "failed_calls":
				failed = n
			}
		}
		total += calls - failed
	}
	return total
}
