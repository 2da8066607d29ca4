package sweeper

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`

func TestElectorChoice(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	camp := config.Campaign{ID: "c-1", Namespace: "shop", PostgresDSN: "postgres://u@127.0.0.1:1/db"}
	for _, tc := range []struct {
		name       string
		lock, kube string
		inCluster  bool
		want       string // Kind, or an error substring
	}{
		{"auto outside kubernetes", LockAuto, "", false, "advisory-lock"},
		{"auto with a kubeconfig", LockAuto, kc, false, "lease"},
		{"postgres in a cluster", LockPostgres, "", true, "advisory-lock"},
		{"lease with a kubeconfig", LockLease, kc, false, "lease"},
		{"lease without an API server", LockLease, "", false, "kubernetes client configuration"},
		{"unknown", "etcd", "", false, "--leader-lock must be"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.inCluster {
				t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
			} else {
				t.Setenv("KUBERNETES_SERVICE_HOST", "")
			}
			el, err := newElector(Options{Campaign: camp, LeaderLock: tc.lock, Kubeconfig: tc.kube}, nil)
			got := ""
			if err != nil {
				got = err.Error()
			} else {
				got = el.Kind()
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv(config.EnvSweepInterval, "2s")
	t.Setenv(config.EnvListen, "127.0.0.1:9999")
	t.Setenv(config.EnvLeaderLock, LockPostgres)
	t.Setenv(config.EnvLogLevel, "debug")
	cmd := NewCmd()
	f := cmd.Flags()
	for name, want := range map[string]string{"interval": "2s", "listen": "127.0.0.1:9999", "leader-lock": "postgres", "log-level": "debug"} {
		if got := f.Lookup(name).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}

	cmd = NewCmd()
	cmd.SetArgs([]string{"--log-level=loud"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Fatalf("--log-level=loud gave %v", err)
	}

	t.Setenv(config.EnvSweepInterval, "soon")
	cmd = NewCmd()
	cmd.SetArgs(nil)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), config.EnvSweepInterval) {
		t.Fatalf("a malformed %s gave %v", config.EnvSweepInterval, err)
	}
}
