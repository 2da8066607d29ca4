package testharness

import (
	"sync"
	"testing"
)

var (
	sharedOnce  sync.Once
	sharedErr   error
	sharedRedis *Redis
	sharedPG    *Postgres
)

// Shared returns a Redis and a PostgreSQL started once per test binary by the
// first test that asks, so tests that need neither (fuzz workers, table tests)
// start nothing. CloseAll, in TestMain, stops them.
func Shared(t testing.TB) (*Redis, *Postgres) {
	t.Helper()
	sharedOnce.Do(func() {
		if sharedRedis, sharedErr = StartRedis(); sharedErr != nil {
			return
		}
		sharedPG, sharedErr = StartPostgres()
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedRedis, sharedPG
}
