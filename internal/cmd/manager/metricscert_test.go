package manager

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// issue writes into dir, as a kubernetes.io/tls Secret mounts them, a
// certificate for 127.0.0.1 signed by a new CA, and returns the CA's pool.
// The files are replaced by renames, as the kubelet updates a mount.
func issue(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "metrics-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "manager-metrics"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool
}

// verifiedAnswer is the status of GET url by a client that trusts only
// roots, or the handshake's error.
func verifiedAnswer(url string, roots *x509.CertPool) (int, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// With --metrics-cert-dir the metrics endpoint serves the certificate given
// (a scraper verifies it before it sends its token), and a new one once the
// Secret's files change, without a restart.
func TestMetricsServeTheCertificateGiven(t *testing.T) {
	kube := testharness.KubeT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	first := issue(t, dir)
	opts := DefaultOptions()
	opts.HealthProbeBindAddress, opts.MetricsBindAddress = freeAddr(t), freeAddr(t)
	opts.MetricsCertDir = dir
	opts.skipNameValidation = true
	done := make(chan error, 1)
	go func() { done <- Run(ctx, kube.Config, opts) }()
	url := "https://" + opts.MetricsBindAddress + "/metrics"
	wait := func(roots *x509.CertPool, what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			code, err := verifiedAnswer(url, roots)
			if err == nil && code == http.StatusUnauthorized { // verified; no token
				return
			}
			select {
			case err := <-done:
				t.Fatalf("Run returned %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d %v", what, code, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	wait(first, "the certificate given, verified by its CA")
	second := issue(t, dir)
	wait(second, "the new certificate, once the files changed")
	var unknown x509.UnknownAuthorityError
	if _, err := verifiedAnswer(url, first); !errors.As(err, &unknown) {
		t.Fatalf("the first CA still verifies the endpoint after the change: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v after cancel", err)
	}
}

// A --metrics-cert-dir the server could not serve from is refused at the
// start, with the directory named; so is one beside plain HTTP.
func TestMetricsCertDirIsChecked(t *testing.T) {
	empty := t.TempDir()
	for _, c := range []struct {
		dir    string
		secure bool
		want   string
	}{
		{empty, true, "--metrics-cert-dir " + empty},
		{filepath.Join(empty, "missing"), true, "no such file"},
		{empty, false, "--metrics-cert-dir needs --metrics-secure"},
	} {
		opts := DefaultOptions()
		opts.MetricsCertDir, opts.MetricsSecure = c.dir, c.secure
		if err := Run(context.Background(), &rest.Config{Host: "http://" + freeAddr(t)}, opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("Run with --metrics-cert-dir %s, --metrics-secure %v = %v, want %q", c.dir, c.secure, err, c.want)
		}
	}
}
