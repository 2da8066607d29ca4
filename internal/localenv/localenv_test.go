package localenv

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

func TestRenderSecretReplacesOnlyThePlaceholders(t *testing.T) {
	samples := filepath.Join(testharness.RepoRoot(), "config", "samples")
	values := map[string]map[string]string{
		"shop-redis":  {"addresses": "127.0.0.1:7001"},
		"shop-ledger": {"dsn": "postgres://u:p@127.0.0.1:7002/db?sslmode=disable"},
	}
	for _, tc := range []struct {
		file    string
		want    map[string]string
		changed []string
	}{
		{"secret_shop-redis.yaml", map[string]string{"addresses": "127.0.0.1:7001"}, []string{"addresses"}},
		{"secret_shop-ledger.yaml", map[string]string{"dsn": "postgres://u:p@127.0.0.1:7002/db?sslmode=disable"}, []string{"dsn"}},
		{"secret_waiting-room.yaml", nil, nil},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b, changed, err := RenderSecret(filepath.Join(samples, tc.file), values)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(changed, tc.changed) {
				t.Errorf("changed %v, want %v", changed, tc.changed)
			}
			var s corev1.Secret
			if err := yaml.UnmarshalStrict(b, &s); err != nil {
				t.Fatalf("rendered manifest is not a Secret: %v\n%s", err, b)
			}
			if s.Kind != "Secret" || s.Name == "" {
				t.Fatalf("rendered %s/%s", s.Kind, s.Name)
			}
			for k, v := range tc.want {
				if s.StringData[k] != v {
					t.Errorf("%s = %q, want %q", k, s.StringData[k], v)
				}
			}
			if tc.want == nil && s.StringData["hmac-key"] == "" {
				t.Error("the waiting-room key was lost")
			}
		})
	}
	if _, _, err := RenderSecret(filepath.Join(samples, "flashsale_v1alpha1_flashsale.yaml"), values); err == nil {
		t.Error("rendering a FlashSale as a Secret succeeded")
	}
}

// A directory below a private one (such as /root) is not traversable: the
// demo then keeps PostgreSQL's data below the system's temporary directory.
func TestTraversable(t *testing.T) {
	open, err := os.MkdirTemp("", "localenv-open-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(open) })
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(open, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if !traversable(filepath.Join(open, "demo")) {
		t.Fatalf("%s/demo: want traversable", open)
	}
	if traversable(filepath.Join(private, "demo")) {
		t.Fatalf("%s/demo: want not traversable", private)
	}
}
