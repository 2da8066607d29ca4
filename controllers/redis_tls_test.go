package controllers

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

func redisSecret(data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "shop-redis"}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

// TestReadRedisTLS: the Redis Secret's TLS keys turn TLS on for the
// operator's own connections; values that cannot work are a
// RedisSecretInvalid reason naming the key, and nothing is connected.
func TestReadRedisTLS(t *testing.T) {
	for _, c := range []struct {
		name    string
		data    map[string]string
		tls     bool
		reason  string
		message string
	}{
		{"plain", map[string]string{"addresses": "a:1,b:2"}, false, "", ""},
		{"rediss://", map[string]string{"addresses": "rediss://a:1"}, true, "", ""},
		{"tls key", map[string]string{"addresses": "a:1", "tls": "true", "serverName": "redis.shop"}, true, "", ""},
		{"tls key false", map[string]string{"addresses": "a:1", "tls": "false"}, false, "", ""},
		{"tls key neither", map[string]string{"addresses": "a:1", "tls": "on"}, false, ReasonRedisSecretInvalid, `key "tls"`},
		// Made with kubectl create secret --from-file: the pods strip the
		// trailing newline, so the operator does too.
		{"tls and server name from files", map[string]string{"addresses": "a:1", "tls": "true\n", "serverName": "redis.shop\n"}, true, "", ""},
		{"CA that is no certificate", map[string]string{"addresses": "rediss://a:1", "ca.crt": "nope"}, false, ReasonRedisSecretInvalid, "CA bundle"},
		{"key without certificate", map[string]string{"addresses": "rediss://a:1", "tls.key": "k"}, false, ReasonRedisSecretInvalid, "without its certificate"},
		{"mixed schemes", map[string]string{"addresses": "rediss://a:1,redis://b:2"}, false, ReasonRedisSecretInvalid, `key "addresses"`},
	} {
		var out references
		err := readRedisTLS(redisSecret(c.data), c.data["addresses"], &out)
		var ref *referenceError
		switch {
		case c.reason == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.reason != "" && (!errors.As(err, &ref) || ref.reason != c.reason || !strings.Contains(ref.message, c.message)):
			t.Errorf("%s: error %v, want reason %s saying %q", c.name, err, c.reason, c.message)
		case c.reason == "" && (out.redis.TLS != nil) != c.tls:
			t.Errorf("%s: TLS config %v, want TLS %v", c.name, out.redis.TLS, c.tls)
		case c.reason == "" && c.data["serverName"] != "" && out.redis.TLS.ServerName != strings.TrimRight(c.data["serverName"], "\n"):
			t.Errorf("%s: server name %q", c.name, out.redis.TLS.ServerName)
		}
	}
}

// TestRedisTLSFingerprints: TLS settings are part of both fingerprints (a
// rotated client certificate reconnects the operator and rolls the pods),
// and a sale without TLS keeps the fingerprints it had.
func TestRedisTLSFingerprints(t *testing.T) {
	base := references{redis: config.Redis{Mode: "standalone", Addresses: []string{"a:1"}}, postgresDSN: "dsn", admissionKey: []byte("k")}
	before := [2]string{base.fingerprint(), base.podFingerprint([]byte("id"), true)}
	withTLS := base
	withTLS.redisTLS = config.RedisTLS{Enabled: true, Cert: []byte("c1")}
	rotated := base
	rotated.redisTLS = config.RedisTLS{Enabled: true, Cert: []byte("c2")}
	off := base
	off.redisTLS = config.RedisTLS{}
	if got := [2]string{off.fingerprint(), off.podFingerprint([]byte("id"), true)}; got != before {
		t.Errorf("a sale without TLS changed fingerprints: %v -> %v", before, got)
	}
	a := [2]string{withTLS.fingerprint(), withTLS.podFingerprint([]byte("id"), false)}
	b := [2]string{rotated.fingerprint(), rotated.podFingerprint([]byte("id"), false)}
	if a[0] == before[0] || a[0] == b[0] || a[1] == b[1] {
		t.Errorf("TLS settings do not change the fingerprints: %v %v %v", before, a, b)
	}
}

// TestPodsReadRedisTLSFromTheSecret: both pods get the TLS variables from
// the Redis Secret, each optional so a Secret without them still starts
// the pods.
func TestPodsReadRedisTLSFromTheSecret(t *testing.T) {
	fs := testSale()
	for _, d := range []*corev1.PodSpec{&ReserveDeployment(fs, "img").Spec.Template.Spec, &SweeperDeployment(fs, "img").Spec.Template.Spec} {
		got := map[string]string{}
		for _, e := range d.Containers[0].Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && strings.HasPrefix(e.Name, "FLASHSALE_REDIS_TLS") {
				ref := e.ValueFrom.SecretKeyRef
				if ref.Name != fs.Spec.Redis.SecretRef.Name || ref.Optional == nil || !*ref.Optional {
					t.Errorf("%s reads %s/%s (optional %v)", e.Name, ref.Name, ref.Key, ref.Optional)
				}
				got[e.Name] = ref.Key
			}
		}
		want := map[string]string{config.EnvRedisTLS: "tls", config.EnvRedisTLSCA: "ca.crt", config.EnvRedisTLSCert: "tls.crt",
			config.EnvRedisTLSKey: "tls.key", config.EnvRedisTLSServerName: "serverName"}
		if len(got) != len(want) {
			t.Errorf("TLS variables %v, want %v", got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s from key %q, want %q", k, got[k], v)
			}
		}
	}
}
