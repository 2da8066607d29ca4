package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func parse(t *testing.T, env map[string]string, args ...string) (*Campaign, error) {
	t.Helper()
	return parseAs(t, Campaign{}, env, args...)
}

// parseAs is parse starting from c (e.g. a role's WithoutAdmissionKey).
func parseAs(t *testing.T, c Campaign, env map[string]string, args ...string) (*Campaign, error) {
	t.Helper()
	for _, k := range []string{EnvAdmissionKey, EnvAdmissionKey + FileSuffix} {
		t.Setenv(k, "") // only what env says
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	c.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return &c, c.Complete()
}

func validEnv() map[string]string {
	return map[string]string{
		EnvCampaignID: "6f1c1f4e-0000-4000-8000-000000000001", EnvSKU: "itm-1",
		EnvRedisAddresses: "127.0.0.1:6379, 127.0.0.1:6380", EnvPostgresDSN: "postgres://x@127.0.0.1/db",
		EnvAdmissionKey: "0123456789abcdef-key", EnvShards: "4", EnvTTL: "2m",
	}
}

func TestFromEnvironment(t *testing.T) {
	c, err := parse(t, validEnv())
	if err != nil {
		t.Fatal(err)
	}
	if c.Shards != 4 || c.TTL.Minutes() != 2 || len(c.Redis.Addresses) != 2 || c.Redis.Addresses[1] != "127.0.0.1:6380" {
		t.Fatalf("%+v", c)
	}
	ec := c.EngineConfig()
	if string(ec.IDSecret) == string(c.AdmissionKey) || len(ec.IDSecret) != 32 {
		t.Fatal("the id secret must be derived, not the admission key itself")
	}
}

// With an id key of its own, the ids do not depend on the admission key: a
// rotated admission key keeps them.
func TestIDKeyOutlivesTheAdmissionKey(t *testing.T) {
	env := validEnv()
	env[EnvIDKey] = "dGhlLXNhbGUncy1vd24taWQta2V5LTAxMjM0NTY3ODk" // "the-sale's-own-id-key-0123456789"
	c, err := parse(t, env)
	if err != nil {
		t.Fatal(err)
	}
	env[EnvAdmissionKey] = "a-rotated-admission-key-98765"
	rotated, err := parse(t, env)
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.EngineConfig().IDSecret, rotated.EngineConfig().IDSecret
	if string(a) != "the-sale's-own-id-key-0123456789" || string(a) != string(b) {
		t.Fatalf("id secrets %q and %q, want the id key for both", a, b)
	}
}

// The sweeper's campaign: no admission key is read, none is required, and its
// engine configuration has no id secret (it sweeps, it does not reserve).
func TestWithoutAdmissionKey(t *testing.T) {
	env := validEnv()
	delete(env, EnvAdmissionKey)
	if _, err := parse(t, env); err == nil || !strings.Contains(err.Error(), EnvAdmissionKey) {
		t.Fatalf("reserve's campaign without a key: %v", err)
	}
	c, err := parseAs(t, Campaign{WithoutAdmissionKey: true}, env)
	if err != nil {
		t.Fatal(err)
	}
	ec := c.EngineConfig()
	if len(c.AdmissionKey) != 0 || ec.IDSecret != nil {
		t.Fatalf("key %q, id secret %x", c.AdmissionKey, ec.IDSecret)
	}
	if err := ec.Validate(); err != nil {
		t.Fatal(err)
	}
	// Given anyway (even a bad one), it is neither read nor checked.
	env[EnvAdmissionKey] = "short"
	env[EnvAdmissionKey+FileSuffix] = "/nonexistent"
	if c, err = parseAs(t, Campaign{WithoutAdmissionKey: true}, env); err != nil || len(c.AdmissionKey) != 0 {
		t.Fatalf("key %q, %v", c.AdmissionKey, err)
	}
}

func TestFlagsOverrideEnvironment(t *testing.T) {
	c, err := parse(t, validEnv(), "--shards=7", "--redis-mode=cluster")
	if err != nil || c.Shards != 7 || c.Redis.Mode != RedisCluster {
		t.Fatalf("%+v %v", c, err)
	}
}

// The previous admission key, during a rotation, is optional, and read as
// the key is: from the variable or a file, without a trailing newline.
func TestPreviousAdmissionKey(t *testing.T) {
	if c, err := parse(t, validEnv()); err != nil || c.AdmissionKeyPrevious != nil {
		t.Fatalf("without one: %q %v", c.AdmissionKeyPrevious, err)
	}
	env := validEnv()
	f := filepath.Join(t.TempDir(), "previous")
	if err := os.WriteFile(f, []byte("the-previous-key-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env[EnvAdmissionKeyPrevious+FileSuffix] = f
	if c, err := parse(t, env); err != nil || string(c.AdmissionKeyPrevious) != "the-previous-key-0123456789" {
		t.Fatalf("from a file: %q %v", c.AdmissionKeyPrevious, err)
	}
}

func TestSecretFromFile(t *testing.T) {
	env := validEnv()
	delete(env, EnvAdmissionKey)
	f := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(f, []byte("from-a-file-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env[EnvAdmissionKey+FileSuffix] = f
	c, err := parse(t, env)
	if err != nil || string(c.AdmissionKey) != "from-a-file-0123456789" {
		t.Fatalf("%q %v", c.AdmissionKey, err)
	}
}

// A key with a trailing newline (a Secret made from a file) is the same key
// from the variable, as the pods get it, and from the file, as tools read it.
func TestSecretFromVariableAndFileAgree(t *testing.T) {
	env := validEnv()
	env[EnvAdmissionKey] = "from-a-file-0123456789\r\n"
	fromVar, err := parse(t, env)
	if err != nil {
		t.Fatal(err)
	}
	if string(fromVar.AdmissionKey) != "from-a-file-0123456789" {
		t.Fatalf("from the variable: %q", fromVar.AdmissionKey)
	}
	// The key as the variable holds it is kept too: tokens signed with it are
	// still taken, and ids derived from it (no id key) stay what they were.
	if string(fromVar.AdmissionKeyAsSet) != "from-a-file-0123456789\r\n" {
		t.Fatalf("as set: %q", fromVar.AdmissionKeyAsSet)
	}
	if got := fromVar.EngineConfig().IDSecret; string(got) != string(DeriveIDSecret([]byte("from-a-file-0123456789\r\n"))) {
		t.Fatal("the derived id key changed with the stripping")
	}
	// So is the previous key's during a rotation: its bytes are copied as
	// stored into the .previous key.
	env[EnvAdmissionKeyPrevious] = "the-old-key-0123456789\n"
	rotating, err := parse(t, env)
	if err != nil {
		t.Fatal(err)
	}
	if string(rotating.AdmissionKeyPrevious) != "the-old-key-0123456789" || string(rotating.AdmissionKeyPreviousAsSet) != "the-old-key-0123456789\n" {
		t.Fatalf("previous: %q, as set: %q", rotating.AdmissionKeyPrevious, rotating.AdmissionKeyPreviousAsSet)
	}
}

func TestBadConfigurationIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name, env, value, want string
	}{
		{"missing campaign", EnvCampaignID, "", EnvCampaignID},
		{"missing redis", EnvRedisAddresses, "", EnvRedisAddresses},
		{"redis list without an address", EnvRedisAddresses, " , ", EnvRedisAddresses},
		{"bad shards", EnvShards, "ten", EnvShards},
		{"bad ttl", EnvTTL, "forever", EnvTTL},
		{"zero ttl", EnvTTL, "0s", "ttl"},
		{"bad mode", EnvRedisMode, "sentinel", "redis-mode"},
		{"short key", EnvAdmissionKey, "short", EnvAdmissionKey},
		{"short previous key", EnvAdmissionKeyPrevious, "short", EnvAdmissionKeyPrevious},
		{"short id key", EnvIDKey, "c2hvcnQ", EnvIDKey},
		{"id key not base64url", EnvIDKey, "not base64url: 0123456789abcdef", EnvIDKey},
		{"no dsn", EnvPostgresDSN, "", EnvPostgresDSN},
		{"steal probes", EnvStealProbes, "3", "stealProbes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := validEnv()
			env[tc.env] = tc.value
			_, err := parse(t, env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v should name %s", err, tc.want)
			}
		})
	}
	env := validEnv()
	env[EnvAdmissionKey+FileSuffix] = "/nonexistent"
	if _, err := parse(t, env); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("both env and file: %v", err)
	}
}
