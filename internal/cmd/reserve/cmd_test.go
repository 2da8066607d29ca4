/*
Copyright 2026 The flashsale-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package reserve

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// The servers are started by the first test that needs them (testharness.Shared).
var (
	sharedRedis *testharness.Redis
	sharedPG    *testharness.Postgres
)

func TestMain(m *testing.M) {
	testharness.Main(m, func() error { return nil })
}

func startShared(t *testing.T) {
	t.Helper()
	sharedRedis, sharedPG = testharness.Shared(t)
}

// clearEnv unsets every FLASHSALE_* variable for the test, so the caller's
// environment cannot change what is tested.
func clearEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "FLASHSALE_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

// complete parses args with the environment as it is and completes them.
func complete(t *testing.T, args ...string) error {
	t.Helper()
	var o Options
	fs := pflag.NewFlagSet("reserve", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o.Complete()
}

func TestFlagsDefaultToEnvironment(t *testing.T) {
	clearEnv(t)
	for k, v := range map[string]string{
		config.EnvCampaignID: "c-1", config.EnvSKU: "itm-1", config.EnvRedisAddresses: "127.0.0.1:6379",
		config.EnvPostgresDSN: "postgres://x@127.0.0.1/db", config.EnvAdmissionKey: "0123456789abcdef-key",
		config.EnvListen: "127.0.0.1:9999", config.EnvRateLimit: "2.5", config.EnvRateBurst: "7", config.EnvShutdownTimeout: "3s",
		config.EnvDrainDelay: "1s", config.EnvAvailabilityCache: "50ms", config.EnvMaxBodyBytes: "4096", config.EnvLogLevel: "debug",
		config.EnvMaxInFlight: "300", config.EnvMemoryLimit: "268435456",
	} {
		t.Setenv(k, v)
	}
	cmd := NewCmd()
	if err := cmd.ParseFlags([]string{"--rate-burst=9"}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"listen": "127.0.0.1:9999", "rate-limit": "2.5", "rate-burst": "9", "shutdown-timeout": "3s",
		"drain-delay": "1s", "availability-cache": "50ms", "max-body-bytes": "4096", "log-level": "debug",
		"request-timeout": "5s", "read-header-timeout": "5s", "sku": "itm-1", "max-in-flight": "300",
		"memory-limit": "268435456",
	} {
		if got := cmd.Flags().Lookup(name).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
}

func TestCompleteNamesWhatIsWrong(t *testing.T) {
	clearEnv(t)
	t.Setenv(config.EnvRateLimit, "fast")
	t.Setenv(config.EnvShutdownTimeout, "soon")
	var o Options
	fs := pflag.NewFlagSet("reserve", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--log-level=loud"}); err != nil {
		t.Fatal(err)
	}
	err := o.Complete()
	for _, want := range []string{config.EnvRateLimit, config.EnvShutdownTimeout, "--log-level", "--campaign-id", config.EnvPostgresDSN} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

// A rate that is not a number would refill every bucket to NaN and refuse
// every buyer after the first request.
func TestRateLimitMustBeFinite(t *testing.T) {
	for _, v := range []string{"NaN", "+Inf", "-1"} {
		clearEnv(t)
		t.Setenv(config.EnvRateLimit, v)
		if err := complete(t); err == nil || !strings.Contains(err.Error(), "--rate-limit must be a finite number") {
			t.Errorf("rate limit %s: %v", v, err)
		}
	}
}

// An in-flight bound below -1 is no count: refused at start, naming the flag.
func TestMaxInFlightMustBeACount(t *testing.T) {
	for v, ok := range map[string]bool{"-2": false, "-1": true, "0": true, "64": true} {
		clearEnv(t)
		err := complete(t, "--max-in-flight="+v)
		if refused := err != nil && strings.Contains(err.Error(), "--max-in-flight"); refused == ok {
			t.Errorf("--max-in-flight=%s: %v", v, err)
		}
	}
}

func TestRedactor(t *testing.T) {
	c := &config.Campaign{
		PostgresDSN:  "host=db user=app password='p@ss word' dbname=ledger",
		AdmissionKey: []byte("admission-key-0123456789"),
		Redis:        config.Redis{Password: "redis-pw"},
	}
	r := redactor(c)
	got := r("cannot parse `host=db user=app password='p@ss word'`; key admission-key-0123456789, redis-pw")
	for _, secret := range []string{"p@ss word", "admission-key", "redis-pw"} {
		if strings.Contains(got, secret) {
			t.Errorf("%q still holds %q", got, secret)
		}
	}
	c.PostgresDSN = "postgres://app:s3cr%2Ft@db:5432/ledger"
	if got := redactor(c)("dial postgres://app:s3cr%2Ft@db failed for s3cr/t"); strings.Contains(got, "s3cr") {
		t.Errorf("%q still holds the password", got)
	}
}

// A ledger that cannot be reached fails the start without showing the DSN's password.
func TestRunFailsWithoutLeakingSecrets(t *testing.T) {
	clearEnv(t)
	t.Setenv(config.EnvCampaignID, "c-1")
	t.Setenv(config.EnvSKU, "itm-1")
	t.Setenv(config.EnvRedisAddresses, "127.0.0.1:1")
	t.Setenv(config.EnvPostgresDSN, "postgres://app:hunter2-secret@127.0.0.1:1/ledger?connect_timeout=2")
	t.Setenv(config.EnvAdmissionKey, "admission-key-0123456789")
	var o Options
	fs := pflag.NewFlagSet("reserve", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	err := Run(context.Background(), o, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err == nil {
		t.Fatal("Run succeeded without a ledger")
	}
	for _, out := range []string{err.Error(), logs.String()} {
		if strings.Contains(out, "hunter2-secret") || strings.Contains(out, "admission-key-0123456789") {
			t.Fatalf("a secret leaked: %s", out)
		}
	}
	// The failure looked at is the ledger's, not an earlier step's.
	if !strings.Contains(logs.String(), "cannot open the ledger") {
		t.Fatalf("Run failed before opening the ledger: %v\n%s", err, logs.String())
	}
}

// A negative pipeline size, linger or pipeline count, from a flag or the environment, is
// refused by name; a size that is not a number names its variable.
func TestReservePipelineMustNotBeNegative(t *testing.T) {
	for _, c := range []struct{ env, val, want string }{
		{config.EnvReservePipeline, "-1", "--reserve-pipeline"},
		{config.EnvReserveLinger, "-1ms", "--reserve-linger"},
		{config.EnvReservePipelines, "-2", "--reserve-pipelines"},
		{config.EnvReservePipelines, "two", config.EnvReservePipelines},
		{config.EnvReservePipeline, "many", config.EnvReservePipeline},
	} {
		clearEnv(t)
		t.Setenv(c.env, c.val)
		if err := complete(t); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s=%s: %v, want an error naming %s", c.env, c.val, err, c.want)
		}
	}
}

// --steal-seed (or its variable) seeds the engine's steal draws: two
// processes given one seed draw the same shards in the same order, so a
// storm replays by seed; unset, each process draws its own. A value that is
// not an unsigned integer, from the flag or the variable, is refused by
// name before anything starts.
func TestStealSeed(t *testing.T) {
	parse := func(args ...string) (*Options, error) {
		var o Options
		fs := pflag.NewFlagSet("reserve", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.AddFlags(fs)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return &o, nil
	}
	draws := func(o *Options) []int {
		src := o.engineConfig().Rand
		if src == nil {
			return nil
		}
		r := mrand.New(src)
		var out []int
		for range 4 {
			out = append(out, r.Perm(10)...)
		}
		return out
	}

	clearEnv(t)
	t.Setenv(config.EnvStealSeed, "42")
	a, err := parse()
	if err != nil || a.StealSeed != 42 {
		t.Fatalf("%s=42: seed %v, %v", config.EnvStealSeed, a, err)
	}
	b, err := parse("--steal-seed=42")
	if err != nil {
		t.Fatal(err)
	}
	c, err := parse("--steal-seed=43")
	if err != nil {
		t.Fatal(err)
	}
	if da, db := draws(a), draws(b); da == nil || !slices.Equal(da, db) {
		t.Fatalf("seed 42 twice: draws %v and %v", da, db)
	}
	if slices.Equal(draws(a), draws(c)) {
		t.Fatal("seeds 42 and 43 draw the same shards")
	}
	clearEnv(t)
	if o, err := parse(); err != nil || o.StealSeed != 0 || o.engineConfig().Rand != nil {
		t.Fatalf("no seed: %+v %v, want the engine's own random source", o, err)
	}

	if _, err := parse("--steal-seed=-1"); err == nil || !strings.Contains(err.Error(), "steal-seed") {
		t.Errorf("--steal-seed=-1: %v, want an error naming the flag", err)
	}
	for _, v := range []string{"-1", "seven", "18446744073709551616"} {
		clearEnv(t)
		t.Setenv(config.EnvStealSeed, v)
		o, err := parse()
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Complete(); err == nil || !strings.Contains(err.Error(), config.EnvStealSeed) {
			t.Errorf("%s=%s: %v, want an error naming it", config.EnvStealSeed, v, err)
		}
	}
	// Through the command: the bad value fails it before it listens.
	clearEnv(t)
	t.Setenv(config.EnvStealSeed, "seven")
	port, err := testharness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := NewCmd()
	cmd.SetArgs([]string{"--listen", addr, "--campaign-id", "c-1", "--sku", "itm-1", "--redis-addresses", "127.0.0.1:1"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), config.EnvStealSeed) {
		t.Fatalf("the command with %s=seven: %v, want an error naming it", config.EnvStealSeed, err)
	}
}

// A memory limit that is not a count of bytes is refused at start, naming
// its variable (the share kept: config.TestGoMemoryLimit).
func TestMemoryLimit(t *testing.T) {
	for _, v := range []string{"256Mi", "-1", "1.5"} {
		clearEnv(t)
		t.Setenv(config.EnvMemoryLimit, v)
		if err := complete(t); err == nil || !strings.Contains(err.Error(), config.EnvMemoryLimit) {
			t.Errorf("%s=%s: %v", config.EnvMemoryLimit, v, err)
		}
	}
}
