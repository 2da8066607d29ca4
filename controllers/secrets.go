package controllers

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// AdmissionPreviousSuffix names the admission Secret's optional key that holds
// the key a rotation replaces: "<key>.previous" ("hmac-key.previous" by
// default). The reserve pods take tokens signed with either.
const AdmissionPreviousSuffix = ".previous"

// Keys of the Redis Secret.
const (
	SecretKeyRedisAddresses = "addresses"
	SecretKeyRedisUsername  = "username"
	SecretKeyRedisPassword  = "password"
	// TLS (optional): "true" turns it on, as rediss:// addresses do; a PEM CA
	// bundle (none: the system's roots); a PEM client certificate and key
	// (the keys of a kubernetes.io/tls Secret); the name the servers'
	// certificates carry (none: each address's host).
	SecretKeyRedisTLS           = "tls"
	SecretKeyRedisTLSCA         = "ca.crt"
	SecretKeyRedisTLSCert       = "tls.crt"
	SecretKeyRedisTLSKey        = "tls.key"
	SecretKeyRedisTLSServerName = "serverName"
)

// references are the values a FlashSale's Secrets hold. Never logged, never in
// status or events.
type references struct {
	redis        config.Redis
	redisTLS     config.RedisTLS // as the Secret holds it; redis.TLS is its tls.Config
	postgresDSN  string
	admissionKey []byte
	// admissionKeyPrevious is the admission Secret's optional "<key>.previous":
	// the key a rotation replaces, which the reserve pods still take.
	admissionKeyPrevious []byte
}

// fingerprint changes when any referenced value changes, so open connections are
// replaced after a Secret rotation.
func (r references) fingerprint() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s\x00%s", r.redis.Mode, strings.Join(r.redis.Addresses, ","),
		r.redis.Username, r.redis.Password, r.postgresDSN, r.admissionKey)
	writeRedisTLS(h, r.redisTLS)
	return hex.EncodeToString(h.Sum(nil))
}

// storeFingerprint is fingerprint for the Redis and ledger references alone.
func (r references) storeFingerprint() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s", r.redis.Mode, strings.Join(r.redis.Addresses, ","),
		r.redis.Username, r.redis.Password, r.postgresDSN)
	writeRedisTLS(h, r.redisTLS)
	return hex.EncodeToString(h.Sum(nil))
}

// podFingerprint is what a pod template carries so that a change to the Secret
// values its pods read (env is fixed at start) rolls them: an HMAC keyed with
// the sale's own id key, so it tells nothing about the values. The reserve pods
// also read the admission key; the sweeper's does not.
func (r references) podFingerprint(idKey []byte, withAdmissionKey bool) string {
	m := hmac.New(sha256.New, idKey)
	fmt.Fprintf(m, "%s\x00%s\x00%s\x00%s", strings.Join(r.redis.Addresses, ","), r.redis.Username, r.redis.Password, r.postgresDSN)
	writeRedisTLS(m, r.redisTLS)
	if withAdmissionKey {
		fmt.Fprintf(m, "\x00%s", r.admissionKey)
		if len(r.admissionKeyPrevious) > 0 {
			fmt.Fprintf(m, "\x00%s", r.admissionKeyPrevious)
		}
	}
	return hex.EncodeToString(m.Sum(nil)[:12])
}

// referenceError names the Secret or key that is missing, for the Ready condition.
type referenceError struct{ reason, message string }

func (e *referenceError) Error() string { return e.message }

// readReferences reads the three Secrets. A missing Secret or key is a
// referenceError; other errors are API failures.
func readReferences(ctx context.Context, c *secretReader, fs *flashsalev1alpha1.FlashSale) (references, error) {
	out, err := readStoreReferences(ctx, c, fs)
	if err != nil {
		return out, err
	}
	s := resolve(fs)
	as, err := getSecret(ctx, c, fs, "admission", fs.Spec.Admission.SecretRef.Name)
	if err != nil {
		return out, err
	}
	k, err := secretKey("admission", as, s.admissionKey)
	if err != nil {
		return out, err
	}
	if len(config.SecretValue(k)) < 16 { // as the pods count it
		return out, &referenceError{ReasonSecretKeyMissing, fmt.Sprintf("admission Secret %q key %q must hold at least 16 bytes", as.Name, s.admissionKey)}
	}
	// Kept as stored: reserve pods from before they had an id key derived it
	// from these bytes as they got them (see idsecret.go).
	out.admissionKey = []byte(k)
	if prev, ok := as.Data[s.admissionKey+AdmissionPreviousSuffix]; ok {
		if len(config.SecretValue(string(prev))) < 16 {
			return out, &referenceError{ReasonSecretKeyMissing, fmt.Sprintf("admission Secret %q key %q must hold at least 16 bytes", as.Name, s.admissionKey+AdmissionPreviousSuffix)}
		}
		out.admissionKeyPrevious = prev
	}
	return out, nil
}

// readStoreReferences reads the Redis and ledger Secrets only: all that
// ending a sale and deleting its keys and campaign needs.
func readStoreReferences(ctx context.Context, c *secretReader, fs *flashsalev1alpha1.FlashSale) (references, error) {
	out, err := readRedisReferences(ctx, c, fs)
	if err != nil {
		return out, err
	}
	ps, err := getSecret(ctx, c, fs, "ledger", fs.Spec.Postgres.SecretRef.Name)
	if err != nil {
		return out, err
	}
	if out.postgresDSN, err = secretKey("ledger", ps, resolve(fs).postgresKey); err != nil {
		return out, err
	}
	out.postgresDSN = config.SecretValue(out.postgresDSN)
	return out, nil
}

// readRedisReferences reads the Redis Secret only: all that closing a sale's
// shards needs.
func readRedisReferences(ctx context.Context, c *secretReader, fs *flashsalev1alpha1.FlashSale) (references, error) {
	s := resolve(fs)
	var out references
	rs, err := getSecret(ctx, c, fs, "Redis", fs.Spec.Redis.SecretRef.Name)
	if err != nil {
		return out, err
	}
	addrs, err := secretKey("Redis", rs, SecretKeyRedisAddresses)
	if err != nil {
		return out, err
	}
	if err := readRedisTLS(rs, addrs, &out); err != nil {
		return out, err
	}
	if len(out.redis.Addresses) == 0 {
		return out, &referenceError{ReasonSecretKeyMissing, fmt.Sprintf("Redis Secret %q key %q lists no address", rs.Name, SecretKeyRedisAddresses)}
	}
	out.redis.Mode = s.redisMode
	out.redis.Username = string(rs.Data[SecretKeyRedisUsername])
	// Read as the pods read it, so the operator and the pods log in alike.
	out.redis.Password = config.SecretValue(string(rs.Data[SecretKeyRedisPassword]))
	return out, nil
}

// getSecret reads one of the sale's Secrets; a missing one is a referenceError.
func getSecret(ctx context.Context, c *secretReader, fs *flashsalev1alpha1.FlashSale, what, name string) (*corev1.Secret, error) {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		// Stored before the CRD refused such names: the API client
		// cannot ask for it, and would fail every retry the same way.
		return nil, &referenceError{ReasonSecretNotFound, fmt.Sprintf("%s Secret name %q is not a Secret name: %s", what, name, strings.Join(errs, "; "))}
	}
	var sec corev1.Secret
	err := c.Get(ctx, types.NamespacedName{Namespace: fs.Namespace, Name: name}, &sec)
	if apierrors.IsNotFound(err) {
		return nil, &referenceError{ReasonSecretNotFound, fmt.Sprintf("%s Secret %q not found in namespace %q", what, name, fs.Namespace)}
	}
	return &sec, err
}

// secretKey is a key's value; a missing or empty key is a referenceError.
func secretKey(what string, sec *corev1.Secret, k string) (string, error) {
	v, ok := sec.Data[k]
	if !ok || len(v) == 0 {
		return "", &referenceError{ReasonSecretKeyMissing, fmt.Sprintf("%s Secret %q has no key %q", what, sec.Name, k)}
	}
	return string(v), nil
}

// idSecret is the engine's reservation id key, none without an admission key
// (an engine that only cleans up never reserves).
func idSecret(refs references) []byte {
	if len(refs.admissionKey) == 0 {
		return nil
	}
	return config.DeriveIDSecret(refs.admissionKey)
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
