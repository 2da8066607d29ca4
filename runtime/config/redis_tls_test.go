package config

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// pki is a CA and the PEM files a TLS Redis and its clients use.
type pki struct {
	dir                           string
	caPEM, certPEM, keyPEM        []byte // the client's
	caFile, serverCert, serverKey string
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// newPKI makes a CA, a server certificate for 127.0.0.1 and redis.test
// (also good as a client certificate, for the cluster bus), and a client
// certificate, all signed by the CA.
func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "flashsale test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, cn string, usage []x509.ExtKeyUsage, ips []net.IP, dns []string) (certPEM, keyPEM []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage, IPAddresses: ips, DNSNames: dns,
		}, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", kb)
	}
	p := &pki{dir: dir, caPEM: pemBlock("CERTIFICATE", caDER)}
	sc, sk := issue(2, "redis", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		[]net.IP{net.ParseIP("127.0.0.1")}, []string{"redis.test"})
	p.certPEM, p.keyPEM = issue(3, "flashsale", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p.caFile, p.serverCert, p.serverKey = write("ca.crt", p.caPEM), write("server.crt", sc), write("server.key", sk)
	return p
}

// serverArgs are redis-server's TLS arguments: a TLS port, client
// certificates required.
func (p *pki) serverArgs(tlsPort int) []string {
	return []string{"--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", p.serverCert, "--tls-key-file", p.serverKey,
		"--tls-ca-cert-file", p.caFile, "--tls-auth-clients", "yes"}
}

func freePort(t *testing.T) int {
	t.Helper()
	port, err := testharness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// campaignFromEnv runs the data-plane configuration path (flags from the
// environment, then Complete) with env on top of a valid campaign.
func campaignFromEnv(t *testing.T, env map[string]string) (*Campaign, error) {
	t.Helper()
	base := map[string]string{
		EnvCampaignID: "c1", EnvSKU: "sku", EnvPostgresDSN: "postgres://x@127.0.0.1/db",
		EnvAdmissionKey: "0123456789abcdef0123",
		EnvRedisTLS:     "", EnvRedisTLSCA: "", EnvRedisTLSCert: "", EnvRedisTLSKey: "", EnvRedisTLSServerName: "",
		EnvRedisTLSKey + FileSuffix: "", EnvRedisTLS + FileSuffix: "", EnvRedisTLSServerName + FileSuffix: "", EnvRedisMode: "",
	}
	for k, v := range env {
		base[k] = v
	}
	for k, v := range base {
		t.Setenv(k, v)
	}
	var c Campaign
	c.AddFlags(pflag.NewFlagSet("test", pflag.ContinueOnError))
	return &c, c.Complete()
}

func ping(c *Campaign) error {
	client := c.Redis.Client()
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return client.Ping(ctx).Err()
}

// TestRedisTLSStandalone: a campaign configured as the controller configures
// the pods reaches a real redis-server over TLS with a client certificate,
// by rediss:// or by tls=true with a server name; without the certificate,
// with another CA, or without TLS, it does not.
func TestRedisTLSStandalone(t *testing.T) {
	p := newPKI(t)
	tlsPort := freePort(t)
	r, err := testharness.StartRedisArgs(p.serverArgs(tlsPort)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	tlsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	keyFile := filepath.Join(p.dir, "client.key")
	if err := os.WriteFile(keyFile, p.keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	other := newPKI(t)
	tlsFile, nameFile := filepath.Join(p.dir, "tls"), filepath.Join(p.dir, "serverName")
	if err := os.WriteFile(tlsFile, []byte("true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(nameFile, []byte("redis.test\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name    string
		env     map[string]string
		wantErr string // "" = PING answers
		// serverLog, when set, is the refusal the server must log: with
		// TLS 1.3 the client's handshake ends before the server checks the
		// client certificate, so the client sees either the server's alert
		// or, when its PING crosses the close, a reset.
		serverLog string
	}{
		{"rediss:// with CA and client certificate", map[string]string{
			EnvRedisAddresses: "rediss://" + tlsAddr, EnvRedisTLSCA: string(p.caPEM),
			EnvRedisTLSCert: string(p.certPEM), EnvRedisTLSKey: string(p.keyPEM)}, "", ""},
		{"tls=true, server name, key from a file", map[string]string{
			EnvRedisAddresses: tlsAddr, EnvRedisTLS: "true", EnvRedisTLSServerName: "redis.test",
			EnvRedisTLSCA: string(p.caPEM), EnvRedisTLSCert: string(p.certPEM), EnvRedisTLSKey + FileSuffix: keyFile}, "", ""},
		{"every setting from a file, as a mounted Secret gives them", map[string]string{
			EnvRedisAddresses: tlsAddr, EnvRedisTLS + FileSuffix: tlsFile, EnvRedisTLSServerName + FileSuffix: nameFile,
			EnvRedisTLSCA: string(p.caPEM), EnvRedisTLSCert: string(p.certPEM), EnvRedisTLSKey + FileSuffix: keyFile}, "", ""},
		{"no client certificate", map[string]string{
			EnvRedisAddresses: "rediss://" + tlsAddr, EnvRedisTLSCA: string(p.caPEM)},
			"certificate|reset by peer|broken pipe|EOF", "peer did not return a certificate"},
		{"another CA", map[string]string{
			EnvRedisAddresses: "rediss://" + tlsAddr, EnvRedisTLSCA: string(other.caPEM),
			EnvRedisTLSCert: string(p.certPEM), EnvRedisTLSKey: string(p.keyPEM)}, "certificate", ""},
		{"a server name the certificate lacks", map[string]string{
			EnvRedisAddresses: tlsAddr, EnvRedisTLS: "true", EnvRedisTLSServerName: "elsewhere.test",
			EnvRedisTLSCA: string(p.caPEM), EnvRedisTLSCert: string(p.certPEM), EnvRedisTLSKey: string(p.keyPEM)}, "elsewhere.test", ""},
		{"plain Redis on the TLS port", map[string]string{EnvRedisAddresses: tlsAddr}, "EOF|reset|i/o timeout", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			logBefore := len(readFile(r.LogPath()))
			camp, err := campaignFromEnv(t, c.env)
			if err != nil {
				t.Fatal(err)
			}
			err = ping(camp)
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatalf("PING over TLS: %v\n%s", err, tail(r.LogPath()))
			case c.wantErr != "" && err == nil:
				t.Fatalf("PING answered, want an error like %q", c.wantErr)
			case c.wantErr != "" && !matchesAny(err.Error(), c.wantErr):
				t.Fatalf("error %q, want one like %q", err, c.wantErr)
			}
			if c.serverLog == "" {
				return
			}
			// The server logs the refusal as it closes the connection.
			deadline := time.Now().Add(10 * time.Second)
			for !strings.Contains(readFile(r.LogPath())[logBefore:], c.serverLog) {
				if time.Now().After(deadline) {
					t.Fatalf("client error %q, but the server never logged %q:\n%s", err, c.serverLog, tail(r.LogPath()))
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func matchesAny(s, alternatives string) bool {
	for _, a := range strings.Split(alternatives, "|") {
		if strings.Contains(s, a) {
			return true
		}
	}
	return false
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// TestRedisTLSCluster: a cluster campaign reaches a TLS Redis Cluster
// (tls-cluster yes) from its rediss:// seeds, and the nodes it learns from
// CLUSTER SLOTS are spoken to over TLS too: keys of every master are written
// and read.
func TestRedisTLSCluster(t *testing.T) {
	p := newPKI(t)
	var tlsAddrs []string
	cluster, err := testharness.StartRedisClusterArgs(func() ([]string, error) {
		port, err := testharness.FreePort()
		if err != nil {
			return nil, err
		}
		tlsAddrs = append(tlsAddrs, "rediss://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		return append(p.serverArgs(port), "--tls-cluster", "yes", "--tls-replication", "yes"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	camp, err := campaignFromEnv(t, map[string]string{
		EnvRedisMode: RedisCluster, EnvRedisAddresses: strings.Join(tlsAddrs[:1], ","),
		EnvRedisTLSCA: string(p.caPEM), EnvRedisTLSCert: string(p.certPEM), EnvRedisTLSKey: string(p.keyPEM)})
	if err != nil {
		t.Fatal(err)
	}
	client := camp.Redis.Client()
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// {0}..{29}: hash tags spread over the slots of all three masters.
	for i := range 30 {
		key := fmt.Sprintf("{%d}k", i)
		if err := client.Set(ctx, key, i, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s over TLS: %v", key, err)
		}
		if got, err := client.Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("GET %s over TLS: %d, %v", key, got, err)
		}
	}
	// Plain connections to the TLS seeds fail: the test spoke TLS.
	plain, err := campaignFromEnv(t, map[string]string{EnvRedisMode: RedisCluster, EnvRedisAddresses: strings.TrimPrefix(tlsAddrs[0], "rediss://")})
	if err != nil {
		t.Fatal(err)
	}
	pc := plain.Redis.Client()
	defer pc.Close()
	short, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := pc.Set(short, "{0}k", 1, time.Minute).Err(); err == nil {
		t.Fatal("a plain client wrote to the cluster's TLS port")
	}
}

// TestRedisTLSBadInput: settings that cannot work are refused with an error
// naming what is wrong, without quoting a key or certificate.
func TestRedisTLSBadInput(t *testing.T) {
	p := newPKI(t)
	for _, c := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"tls neither true nor false", map[string]string{EnvRedisAddresses: "127.0.0.1:1", EnvRedisTLS: "yes please"}, "must be true or false"},
		{"CA bundle without a certificate", map[string]string{EnvRedisAddresses: "rediss://127.0.0.1:1", EnvRedisTLSCA: "not a certificate"}, "holds no PEM certificate"},
		{"certificate without key", map[string]string{EnvRedisAddresses: "rediss://127.0.0.1:1", EnvRedisTLSCert: string(p.certPEM)}, "without its key"},
		{"key without certificate", map[string]string{EnvRedisAddresses: "rediss://127.0.0.1:1", EnvRedisTLSKey: string(p.keyPEM)}, "without its certificate"},
		{"certificate and key that do not match", map[string]string{EnvRedisAddresses: "rediss://127.0.0.1:1",
			EnvRedisTLSCert: string(p.certPEM), EnvRedisTLSKey: string(newPKI(t).keyPEM)}, "not a PEM certificate and its private key"},
		{"tls given twice", map[string]string{EnvRedisAddresses: "127.0.0.1:1", EnvRedisTLS: "true", EnvRedisTLS + FileSuffix: "/nonexistent"}, "not both"},
		{"server name given twice", map[string]string{EnvRedisAddresses: "rediss://127.0.0.1:1",
			EnvRedisTLSServerName: "redis.test", EnvRedisTLSServerName + FileSuffix: "/nonexistent"}, "not both"},
		{"tls from a file that is not there", map[string]string{EnvRedisAddresses: "127.0.0.1:1", EnvRedisTLS + FileSuffix: "/nonexistent/tls"}, "no such file"},
		{"TLS settings with TLS off", map[string]string{EnvRedisAddresses: "127.0.0.1:1", EnvRedisTLSCA: string(p.caPEM)}, "TLS is off"},
		{"mixed schemes", map[string]string{EnvRedisAddresses: "rediss://127.0.0.1:1,redis://127.0.0.1:2"}, "mix redis:// and rediss://"},
		{"another scheme", map[string]string{EnvRedisAddresses: "http://127.0.0.1:1"}, "only redis:// and rediss://"},
		{"credentials in the address", map[string]string{EnvRedisAddresses: "rediss://user:pw@127.0.0.1:1"}, "addresses are host:port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := campaignFromEnv(t, c.env)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), "user:pw") {
				t.Fatalf("the error quotes a secret: %v", err)
			}
		})
	}
}

func TestParseRedisAddresses(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
		tls  bool
	}{
		{"127.0.0.1:6379", "127.0.0.1:6379", false},
		{" a:1 , b:2 ,", "a:1,b:2", false},
		{"redis://a:1/", "a:1", false},
		{"rediss://a:1,rediss://b:2", "a:1,b:2", true},
		{"rediss://a:1,b:2", "a:1,b:2", true},
	} {
		got, tls, err := ParseRedisAddresses(c.in)
		if err != nil || strings.Join(got, ",") != c.want || tls != c.tls {
			t.Errorf("ParseRedisAddresses(%q) = %v, %v, %v; want %s, %v", c.in, got, tls, err, c.want, c.tls)
		}
	}
}
