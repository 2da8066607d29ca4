package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Environment variables of Redis TLS, set by the controller from the Redis
// Secret's keys of the same meaning (SecretKeyRedisTLS... in controllers).
// The PEM values may be given as files too (the _FILE suffix).
const (
	EnvRedisTLS           = "FLASHSALE_REDIS_TLS"             // "true" turns TLS on (so does rediss://)
	EnvRedisTLSCA         = "FLASHSALE_REDIS_TLS_CA"          // PEM CA bundle; none: the system's roots
	EnvRedisTLSCert       = "FLASHSALE_REDIS_TLS_CERT"        // PEM client certificate (chain)
	EnvRedisTLSKey        = "FLASHSALE_REDIS_TLS_KEY"         // PEM client key (secret)
	EnvRedisTLSServerName = "FLASHSALE_REDIS_TLS_SERVER_NAME" // name checked in the server's certificate
)

// RedisTLS is how to speak TLS to Redis, as a Secret or the environment
// gives it: PEM bytes and names, checked and turned into a tls.Config by
// Config.
type RedisTLS struct {
	// Enabled: a "tls" value of true, or addresses given as rediss://.
	Enabled bool
	// CA is a PEM bundle of the certificates that may sign the servers';
	// empty: the system's roots.
	CA []byte
	// Cert and Key are a PEM client certificate and its key, for servers
	// that ask for one (tls-auth-clients); both or neither.
	Cert, Key []byte
	// ServerName is the name the servers' certificates must carry; empty:
	// each address's host, which for a cluster is each node's own.
	ServerName string
}

// ParseTLSFlag reads a "tls" value as the pods read it: surrounding
// whitespace ignored, empty is false, else the forms of strconv.ParseBool.
// The controller reads the Redis Secret's "tls" key with it too, so that a
// value is accepted by both or by neither.
func ParseTLSFlag(what, v string) (bool, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		// The value is not quoted: it comes from a Secret.
		return false, fmt.Errorf("%s must be true or false", what)
	}
	return b, nil
}

// ParseRedisAddresses splits a comma-separated address list whose entries
// may carry a redis:// or rediss:// scheme. TLS reports rediss://; mixing
// the two schemes is an error, since one client speaks one of them.
func ParseRedisAddresses(list string) (addrs []string, tlsScheme bool, err error) {
	var plain, secure bool
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		switch {
		case a == "":
			continue
		case strings.HasPrefix(a, "rediss://"):
			secure, a = true, strings.TrimPrefix(a, "rediss://")
		case strings.HasPrefix(a, "redis://"):
			plain, a = true, strings.TrimPrefix(a, "redis://")
		case strings.Contains(a, "://"):
			return nil, false, fmt.Errorf("Redis address %q: only redis:// and rediss:// are understood", a)
		}
		a = strings.TrimSuffix(a, "/")
		if strings.Contains(a, "@") { // not quoted: it may hold a password
			return nil, false, errors.New("a Redis address holds credentials, which go in username and password: addresses are host:port")
		}
		if a == "" || strings.ContainsAny(a, "/?") {
			return nil, false, fmt.Errorf("Redis address %q is not host:port", a)
		}
		addrs = append(addrs, a)
	}
	if plain && secure {
		return nil, false, errors.New("Redis addresses mix redis:// and rediss://: use one")
	}
	return addrs, secure, nil
}

// Config is the client's tls.Config, or nil without TLS. It fails, saying
// which value is wrong but not quoting it, on a CA bundle with no
// certificate, a certificate without its key (or the other way round), or a
// pair that does not match.
func (t RedisTLS) Config() (*tls.Config, error) {
	if !t.Enabled {
		if len(t.CA) > 0 || len(t.Cert) > 0 || len(t.Key) > 0 || t.ServerName != "" {
			return nil, errors.New(`TLS settings are given but TLS is off: set tls to "true" or use rediss:// addresses`)
		}
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: strings.TrimSpace(t.ServerName)}
	if len(t.CA) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(t.CA) {
			return nil, errors.New("the TLS CA bundle holds no PEM certificate")
		}
		c.RootCAs = pool
	}
	switch {
	case len(t.Cert) > 0 && len(t.Key) > 0:
		pair, err := tls.X509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, errors.New("the TLS client certificate and key are not a PEM certificate and its private key")
		}
		c.Certificates = []tls.Certificate{pair}
	case len(t.Cert) > 0:
		return nil, errors.New("a TLS client certificate is given without its key")
	case len(t.Key) > 0:
		return nil, errors.New("a TLS client key is given without its certificate")
	}
	return c, nil
}

// completeRedisTLS reads the TLS settings from the environment (or _FILE
// files), strips the addresses' schemes and sets c.Redis.TLS.
func (c *Campaign) completeRedisTLS() error {
	addrs, scheme, err := ParseRedisAddresses(strings.Join(c.Redis.Addresses, ","))
	if err != nil {
		return fmt.Errorf("--redis-addresses (or %s): %w", EnvRedisAddresses, err)
	}
	c.Redis.Addresses = addrs
	// Every setting may come from a file (_FILE), as the documentation says
	// of all five: a Secret mounted as files holds them all.
	flag, err := Secret(EnvRedisTLS)
	if err != nil {
		return err
	}
	on, err := ParseTLSFlag(EnvRedisTLS, flag)
	if err != nil {
		return err
	}
	serverName, err := Secret(EnvRedisTLSServerName)
	if err != nil {
		return err
	}
	t := RedisTLS{Enabled: on || scheme, ServerName: serverName}
	var errs []error
	for env, dst := range map[string]*[]byte{EnvRedisTLSCA: &t.CA, EnvRedisTLSCert: &t.Cert, EnvRedisTLSKey: &t.Key} {
		v, err := readPEM(env)
		errs = append(errs, err)
		*dst = v
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	cfg, err := t.Config()
	if err != nil {
		return fmt.Errorf("Redis TLS (%s...): %w", EnvRedisTLS, err)
	}
	c.Redis.TLS = cfg
	return nil
}

// readPEM is Secret without the trailing-newline trim mattering: PEM
// parsing ignores surrounding whitespace.
func readPEM(env string) ([]byte, error) {
	v, err := Secret(env)
	return []byte(v), err
}
