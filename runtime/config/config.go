// Package config is the configuration of the data-plane processes (reserve,
// sweeper): flags with defaults from environment variables, which is how the
// controller configures their pods, and secrets read from the environment or from
// files, never from flags and never logged.
package config

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// Environment variables set by the controller on the reserve and sweeper pods.
// Each secret may instead be given as a file: the same name with a _FILE suffix.
const (
	EnvCampaignID     = "FLASHSALE_CAMPAIGN_ID"
	EnvNamespace      = "FLASHSALE_NAMESPACE"
	EnvName           = "FLASHSALE_NAME"
	EnvSKU            = "FLASHSALE_SKU"
	EnvShards         = "FLASHSALE_SHARDS"
	EnvMaxPerUser     = "FLASHSALE_MAX_PER_USER"
	EnvTTL            = "FLASHSALE_TTL"
	EnvGracePeriod    = "FLASHSALE_GRACE_PERIOD"
	EnvStealProbes    = "FLASHSALE_STEAL_PROBES"
	EnvRedisMode      = "FLASHSALE_REDIS_MODE"
	EnvRedisAddresses = "FLASHSALE_REDIS_ADDRESSES"
	EnvRedisUsername  = "FLASHSALE_REDIS_USERNAME"
	EnvRedisPassword  = "FLASHSALE_REDIS_PASSWORD" // secret
	EnvPostgresDSN    = "FLASHSALE_POSTGRES_DSN"   // secret
	EnvAdmissionKey   = "FLASHSALE_ADMISSION_KEY"  // secret
	// EnvAdmissionKeyPrevious is a key tokens may still be signed with during
	// a rotation (optional secret).
	EnvAdmissionKeyPrevious = "FLASHSALE_ADMISSION_KEY_PREVIOUS"
	// EnvIDKey is the key of reservation ids (secret), unpadded base64url
	// (an environment variable cannot hold any byte). Without it the ids are
	// keyed by a key derived from the admission key, which then must not change
	// during a sale.
	EnvIDKey   = "FLASHSALE_ID_KEY"
	FileSuffix = "_FILE"
)

// Redis modes.
const (
	RedisStandalone = "standalone"
	RedisCluster    = "cluster"
)

// Redis says how to reach the shards.
type Redis struct {
	Mode      string
	Addresses []string
	Username  string
	Password  string
	// TLS, when set, is used for every connection (redis_tls.go).
	TLS *tls.Config
}

// RedisPoolSize is the most connections a process keeps to one Redis server.
const RedisPoolSize = 128

// Client returns a client for the mode: a cluster client, or a plain client on the
// first address. Timeouts are short: a reservation must fail fast, not hang.
//
// The client never re-sends a command that may have run: after a timeout or a
// lost connection the scripts' effects are unknown, and running one again (a
// quota claim, a restore's counter) is not the same as running it once; the
// caller resolves the doubt by looking. So MaxRetries is -1 (none; 0 would
// mean go-redis's default of 3). A cluster client still follows MOVED and ASK
// (MaxRedirects, default 3): a redirect means the command did not run; the
// reserve script alone goes on a master's own client, which follows none
// (runtime/stock). Its
// redirect loop also re-sends after a timeout, which only the scripts' own
// no-retry commands stop (runtime/stock). Reads go to masters only (no
// ReadOnly, RouteByLatency or RouteRandomly): a replica may lag its master.
func (r Redis) Client() redis.UniversalClient {
	if r.Mode == RedisCluster {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: r.Addresses, Username: r.Username, Password: r.Password, TLSConfig: r.TLS,
			DialTimeout: 2 * time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			PoolSize: RedisPoolSize, MaxRetries: -1,
		})
	}
	return redis.NewClient(&redis.Options{
		Addr: r.Addresses[0], Username: r.Username, Password: r.Password, TLSConfig: r.TLS,
		DialTimeout: 2 * time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		PoolSize: RedisPoolSize, MaxRetries: -1,
	})
}

// Campaign is what a data-plane process needs to serve one FlashSale.
type Campaign struct {
	ID, Namespace, Name, SKU string
	Shards                   int
	MaxPerUser               int
	StealProbes              int
	TTL, GracePeriod         time.Duration
	Redis                    Redis
	PostgresDSN              string
	AdmissionKey             []byte
	// AdmissionKeyAsSet is the admission key as the variable held it, when
	// that ended in CR or LF (which AdmissionKey drops): processes before
	// the stripping used it so, so tokens signed with it are still taken and
	// ids derived from it stay the same.
	AdmissionKeyAsSet []byte
	// AdmissionKeyPrevious, when set, is taken too: the key a rotation
	// replaces, for the tokens the waiting room signed with it.
	AdmissionKeyPrevious []byte
	// AdmissionKeyPreviousAsSet is the previous key as the variable held
	// it, when that ended in CR or LF: a rotation copies the old key's bytes
	// as stored, and a waiting room that signed with them before still does.
	AdmissionKeyPreviousAsSet []byte
	IDKey                     []byte // the reservation ids' key; none: derived from the admission key

	// WithoutAdmissionKey is set by roles that neither check admission tokens nor
	// make reservations (the sweeper): Complete does not read the key, so their
	// pods need not hold it, and EngineConfig has no reservation id secret.
	WithoutAdmissionKey bool

	redisAddresses string
	env            EnvDefaults // malformed environment values, reported by Complete
}

// AddFlags registers the campaign flags; their defaults come from the environment.
func (c *Campaign) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ID, "campaign-id", os.Getenv(EnvCampaignID), "FlashSale UID: the campaign identity in Redis keys and the ledger (env "+EnvCampaignID+")")
	fs.StringVar(&c.Namespace, "namespace", os.Getenv(EnvNamespace), "namespace of the FlashSale (env "+EnvNamespace+")")
	fs.StringVar(&c.Name, "name", os.Getenv(EnvName), "name of the FlashSale (env "+EnvName+")")
	fs.StringVar(&c.SKU, "sku", os.Getenv(EnvSKU), "SKU on sale (env "+EnvSKU+")")
	fs.IntVar(&c.Shards, "shards", c.env.Int(EnvShards, 10), "number of stock shards (env "+EnvShards+")")
	fs.IntVar(&c.MaxPerUser, "max-per-user", c.env.Int(EnvMaxPerUser, 1), "units one user may hold (env "+EnvMaxPerUser+")")
	fs.IntVar(&c.StealProbes, "steal-probes", c.env.Int(EnvStealProbes, 2), "other shards tried when the home shard is sold out, 0-2 (env "+EnvStealProbes+")")
	fs.DurationVar(&c.TTL, "ttl", c.env.Duration(EnvTTL, 10*time.Minute), "reservation lifetime (env "+EnvTTL+")")
	fs.DurationVar(&c.GracePeriod, "grace-period", c.env.Duration(EnvGracePeriod, 30*time.Second), "time after expiry before the sweeper releases (env "+EnvGracePeriod+")")
	fs.StringVar(&c.Redis.Mode, "redis-mode", EnvString(EnvRedisMode, RedisStandalone), "standalone or cluster (env "+EnvRedisMode+")")
	fs.StringVar(&c.redisAddresses, "redis-addresses", os.Getenv(EnvRedisAddresses), "comma-separated host:port list (env "+EnvRedisAddresses+")")
	fs.StringVar(&c.Redis.Username, "redis-username", os.Getenv(EnvRedisUsername), "Redis ACL user (env "+EnvRedisUsername+")")
}

// Complete reads the secrets and checks everything, naming the flag or variable
// that is wrong.
func (c *Campaign) Complete() error {
	errs := []error{c.env.Err()}
	need := func(v, flag, env string) {
		if strings.TrimSpace(v) == "" {
			errs = append(errs, fmt.Errorf("--%s (or %s) is required", flag, env))
		}
	}
	need(c.ID, "campaign-id", EnvCampaignID)
	need(c.SKU, "sku", EnvSKU)
	for _, a := range strings.Split(c.redisAddresses, ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.Redis.Addresses = append(c.Redis.Addresses, a)
		}
	}
	if len(c.Redis.Addresses) == 0 {
		// Also for "," or " , ": a list with no address in it.
		errs = append(errs, fmt.Errorf("--redis-addresses (or %s) is required: a comma-separated list of host:port", EnvRedisAddresses))
	}
	errs = append(errs, c.completeRedisTLS())
	if c.Redis.Mode != RedisStandalone && c.Redis.Mode != RedisCluster {
		errs = append(errs, fmt.Errorf("--redis-mode must be %q or %q, got %q", RedisStandalone, RedisCluster, c.Redis.Mode))
	}
	pw, err := Secret(EnvRedisPassword)
	errs = append(errs, err)
	c.Redis.Password = pw
	c.PostgresDSN, err = Secret(EnvPostgresDSN)
	errs = append(errs, err)
	need(c.PostgresDSN, "(no flag: a secret)", EnvPostgresDSN+" or "+EnvPostgresDSN+FileSuffix)
	if !c.WithoutAdmissionKey {
		key, err := Secret(EnvAdmissionKey)
		errs = append(errs, err)
		c.AdmissionKey = []byte(key)
		if raw := os.Getenv(EnvAdmissionKey); raw != key && raw != "" {
			c.AdmissionKeyAsSet = []byte(raw)
		}
		if len(c.AdmissionKey) < 16 {
			errs = append(errs, fmt.Errorf("the admission key (%s or %s%s) must be at least 16 bytes", EnvAdmissionKey, EnvAdmissionKey, FileSuffix))
		}
		previous, err := Secret(EnvAdmissionKeyPrevious)
		errs = append(errs, err)
		if previous != "" {
			c.AdmissionKeyPrevious = []byte(previous)
			if raw := os.Getenv(EnvAdmissionKeyPrevious); raw != previous && raw != "" {
				c.AdmissionKeyPreviousAsSet = []byte(raw)
			}
			if len(previous) < 16 {
				errs = append(errs, fmt.Errorf("the previous admission key (%s or %s%s) must be at least 16 bytes", EnvAdmissionKeyPrevious, EnvAdmissionKeyPrevious, FileSuffix))
			}
		}
		idKey, err := Secret(EnvIDKey)
		errs = append(errs, err)
		if idKey != "" {
			c.IDKey, err = base64.RawURLEncoding.DecodeString(idKey)
			if err != nil || len(c.IDKey) < 16 {
				errs = append(errs, fmt.Errorf("the reservation id key (%s or %s%s) must be at least 16 bytes in unpadded base64url", EnvIDKey, EnvIDKey, FileSuffix))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return c.EngineConfig().Validate()
}

// EngineConfig is the engine's view of the campaign. Without an admission key it
// has no reservation id secret: such an engine sweeps but cannot reserve.
func (c *Campaign) EngineConfig() engine.Config {
	var idSecret []byte
	switch {
	case len(c.IDKey) > 0:
		idSecret = c.IDKey
	case len(c.AdmissionKeyAsSet) > 0:
		idSecret = DeriveIDSecret(c.AdmissionKeyAsSet)
	case len(c.AdmissionKey) > 0:
		idSecret = DeriveIDSecret(c.AdmissionKey)
	}
	return engine.Config{
		CampaignID: c.ID, Namespace: c.Namespace, Name: c.Name, SKU: c.SKU,
		Shards: c.Shards, MaxPerUser: c.MaxPerUser, StealProbes: c.StealProbes,
		TTL: c.TTL, Grace: c.GracePeriod, IDSecret: idSecret,
	}
}

// DeriveIDSecret derives the key of reservation ids from the admission key, for
// reserve processes run without an id key of their own (FLASHSALE_ID_KEY). The
// operator gives each sale its own id key, so that rotating the admission key
// during a sale does not change the ids, and with them what a retried request
// with the same idempotency key replays.
func DeriveIDSecret(admissionKey []byte) []byte {
	m := hmac.New(sha256.New, admissionKey)
	m.Write([]byte("flashsale reservation id v1"))
	return m.Sum(nil)
}

// Secret reads a secret from the environment variable env, or from the file named
// by env_FILE. Setting both is an error; neither gives "". Trailing CR and LF are
// not part of a secret, from either: a Secret made from a file ending in a
// newline gives pods (as a variable) and tools (as a file) the same key.
func Secret(env string) (string, error) {
	v, file := os.Getenv(env), os.Getenv(env+FileSuffix)
	switch {
	case v != "" && file != "":
		return "", fmt.Errorf("set %s or %s%s, not both", env, env, FileSuffix)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s%s: %w", env, FileSuffix, err)
		}
		return SecretValue(string(b)), nil
	}
	return SecretValue(v), nil
}

// SecretValue is a secret's value as every reader of it takes it: without
// trailing CR and LF. The operator reads its Secrets' keys with it, so that
// it and the pods (through Secret) see the same values.
func SecretValue(v string) string { return strings.TrimRight(v, "\r\n") }
