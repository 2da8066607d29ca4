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

package token

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

const key = "waiting-room-key-0123456789"

func run(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	for _, k := range []string{config.EnvAdmissionKey, config.EnvAdmissionKey + config.FileSuffix, config.EnvSKU} {
		t.Setenv(k, env[k])
		if env[k] == "" {
			os.Unsetenv(k)
		}
	}
	cmd := NewCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestMintsAVerifiableToken(t *testing.T) {
	file := filepath.Join(t.TempDir(), "hmac-key")
	if err := os.WriteFile(file, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"key file flag", nil, []string{"--sku", "itm-1", "--user", "u-1", "--ttl", "2m", "--key-file", file}},
		{"key in env", map[string]string{config.EnvAdmissionKey: key}, []string{"--sku", "itm-1", "--user", "u-1", "--ttl", "2m"}},
		{"key file in env, sku in env", map[string]string{config.EnvAdmissionKey + config.FileSuffix: file, config.EnvSKU: "itm-1"},
			[]string{"--user", "u-1", "--ttl", "2m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, tc.env, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			tok := strings.TrimSuffix(out, "\n")
			if strings.ContainsAny(tok, " \n") || !strings.HasPrefix(tok, "v1.") {
				t.Fatalf("output %q is not one token line", out)
			}
			c, err := admission.Verify([]byte(key), tok, "itm-1", "u-1", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Until(c.ExpiresAt()); d < 110*time.Second || d > 121*time.Second {
				t.Fatalf("expires in %s, want about 2m", d)
			}
			if _, err := admission.Verify([]byte(key), tok, "itm-1", "u-1", time.Now().Add(3*time.Minute)); err == nil {
				t.Fatal("the token outlives its ttl")
			}
		})
	}
}

func TestRefuses(t *testing.T) {
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	withKey := map[string]string{config.EnvAdmissionKey: key}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no key", nil, []string{"--sku", "s", "--user", "u"}, "no admission key"},
		{"short key", nil, []string{"--sku", "s", "--user", "u", "--key-file", short}, "at least 16 bytes"},
		{"missing key file", nil, []string{"--sku", "s", "--user", "u", "--key-file", "/nonexistent"}, "--key-file"},
		{"no user", withKey, []string{"--sku", "s"}, "user"},
		{"no sku", withKey, []string{"--user", "u"}, "sku"},
		{"zero ttl", withKey, []string{"--sku", "s", "--user", "u", "--ttl", "0s"}, "ttl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, tc.env, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || out != "" {
				t.Fatalf("output %q, err %v; want an error about %q", out, err, tc.want)
			}
		})
	}
}
