package controllers

import (
	"fmt"
	"hash"

	corev1 "k8s.io/api/core/v1"

	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// readRedisTLS reads the Redis Secret's addresses (redis:// or rediss://
// allowed) and TLS keys into out. A value that cannot be used is a
// RedisSecretInvalid reference error naming the key, never quoting it.
func readRedisTLS(rs *corev1.Secret, addrs string, out *references) error {
	invalid := func(err error) error {
		return &referenceError{ReasonRedisSecretInvalid, fmt.Sprintf("Redis Secret %q: %v", rs.Name, err)}
	}
	list, scheme, err := config.ParseRedisAddresses(addrs)
	if err != nil {
		return invalid(fmt.Errorf("key %q: %w", SecretKeyRedisAddresses, err))
	}
	out.redis.Addresses = list
	t := config.RedisTLS{
		Enabled: scheme,
		CA:      rs.Data[SecretKeyRedisTLSCA],
		Cert:    rs.Data[SecretKeyRedisTLSCert],
		Key:     rs.Data[SecretKeyRedisTLSKey],
		// As the pods read it: a file's trailing newline is not part of the name.
		ServerName: config.SecretValue(string(rs.Data[SecretKeyRedisTLSServerName])),
	}
	on, err := config.ParseTLSFlag(fmt.Sprintf("key %q", SecretKeyRedisTLS), string(rs.Data[SecretKeyRedisTLS]))
	if err != nil {
		return invalid(err)
	}
	t.Enabled = t.Enabled || on
	cfg, err := t.Config()
	if err != nil {
		return invalid(err)
	}
	out.redisTLS, out.redis.TLS = t, cfg
	return nil
}

// writeTo adds the TLS settings to a fingerprint; without TLS it adds
// nothing, so the fingerprints of sales that do not use it stay as they were.
func writeRedisTLS(h hash.Hash, t config.RedisTLS) {
	if !t.Enabled {
		return
	}
	fmt.Fprintf(h, "\x00tls\x00%s\x00%s\x00%s\x00%s", t.CA, t.Cert, t.Key, t.ServerName)
}

// redisTLSEnv passes the Redis Secret's TLS keys to the pods, each optional:
// a Secret without them gives the variables no value, and the pods speak
// plain Redis.
func redisTLSEnv(secretName string) []corev1.EnvVar {
	keys := []struct{ name, key string }{
		{config.EnvRedisTLS, SecretKeyRedisTLS},
		{config.EnvRedisTLSCA, SecretKeyRedisTLSCA},
		{config.EnvRedisTLSCert, SecretKeyRedisTLSCert},
		{config.EnvRedisTLSKey, SecretKeyRedisTLSKey},
		{config.EnvRedisTLSServerName, SecretKeyRedisTLSServerName},
	}
	env := make([]corev1.EnvVar, 0, len(keys))
	for _, v := range keys {
		optional := true
		env = append(env, corev1.EnvVar{Name: v.name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secretName}, Key: v.key, Optional: &optional,
		}}})
	}
	return env
}
