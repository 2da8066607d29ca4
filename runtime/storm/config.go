package storm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Defaults for zero Config fields.
const (
	DefaultConcurrency = 64
	DefaultTokenTTL    = 10 * time.Minute
	DefaultTimeout     = 10 * time.Second
	DefaultMaxAttempts = 3
	DefaultProgress    = time.Second
)

// Config describes one storm.
type Config struct {
	// URLs are reserve base URLs (e.g. http://127.0.0.1:8080). Buyers are spread
	// over them like a Service would; an attempt that fails in transport or
	// with 503 is repeated on the next one.
	URLs []string
	SKU  string
	Mint Minter

	Buyers      int           // distinct users
	Concurrency int           // requests in flight at most
	Count       int           // journeys (one reserve request each, plus what follows); 0 with Duration 0 means Buyers
	Duration    time.Duration // stop starting journeys after this; 0 means only Count bounds the run

	RetryRatio    float64 // journeys that send their reserve request twice (a client retry)
	CheckoutRatio float64 // acknowledged reservations paid for
	CancelRatio   float64 // acknowledged reservations cancelled by the buyer
	AbandonRatio  float64 // acknowledged reservations left to expire (the rest of 1)
	// LoseRatio is the acknowledged reservations whose answer the buyer
	// loses, with its idempotency key: it finds the reservation in its list
	// (GET /api/v1/flash-sale/reservations) before paying, cancelling or
	// walking away, and the storm checks the list against the answer it
	// saw (Result.ListViolations).
	LoseRatio float64

	Quantity    int           // units per reservation; 0 means 1
	UserPrefix  string        // user ids are <prefix>-<n>; keep runs apart with distinct prefixes
	TokenTTL    time.Duration // admission token lifetime
	Timeout     time.Duration // per request
	MaxAttempts int           // attempts per request on transport errors, 503 and 429
	Seed        uint64        // journey n makes the same choices (retry, checkout, ...) for the same seed
	// Rate, when positive, makes the storm open-loop: journey n starts at
	// n/Rate seconds into the run whatever the answers so far, on at most
	// Concurrency connections, and its reserve request's latency is measured
	// from that intended start (see openloop.go). 0: closed loop, each worker
	// starts its next journey when the last one ends.
	Rate float64

	Client *http.Client // nil: NewClient(Concurrency, Timeout)

	Progress      func(Progress) // called every ProgressEvery and once at the end; may be nil
	ProgressEvery time.Duration

	Now func() time.Time // nil: time.Now
	// Sleep waits d or until ctx ends (the open loop's schedule, the backoff
	// between attempts); nil: a timer.
	Sleep func(ctx context.Context, d time.Duration)
}

func (c *Config) defaults() {
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Count <= 0 && c.Duration <= 0 {
		c.Count = c.Buyers
	}
	if c.Quantity <= 0 {
		c.Quantity = 1
	}
	if c.TokenTTL <= 0 {
		c.TokenTTL = DefaultTokenTTL
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = DefaultProgress
	}
	if c.UserPrefix == "" {
		c.UserPrefix = "buyer"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
	if c.Client == nil {
		c.Client = NewClient(c.Concurrency, c.Timeout)
	}
}

// MaxUserPrefix leaves room in the API's 128 bytes for the rest of an
// idempotency key: "-", the storm's 8-digit tag, "-j" and a journey number.
const MaxUserPrefix = 64

// ratioSlack absorbs float rounding when ratios are meant to add up to 1.
const ratioSlack = 1e-9

// Validate reports the first problem with a Config.
func (c Config) Validate() error {
	if len(c.URLs) == 0 {
		return errors.New("at least one reserve URL is required")
	}
	for _, u := range c.URLs {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("reserve URL %q must be http(s)://host[:port]", u)
		}
	}
	switch {
	case c.SKU == "":
		return errors.New("the SKU is required")
	case c.Mint == nil:
		return errors.New("a token minter is required")
	case c.Buyers < 1:
		return fmt.Errorf("buyers must be at least 1, got %d", c.Buyers)
	case c.Count < 0 || c.Duration < 0 || c.Concurrency < 0:
		return errors.New("count, duration and concurrency must not be negative")
	case c.Quantity < 0 || c.MaxAttempts < 0 || c.Timeout < 0 || c.TokenTTL < 0:
		return errors.New("quantity, attempts, timeout and token lifetime must not be negative")
	case len(c.UserPrefix) > MaxUserPrefix:
		return fmt.Errorf("the user prefix is at most %d bytes, got %d: buyers' ids and idempotency keys are built on it and the API takes 128", MaxUserPrefix, len(c.UserPrefix))
	case !(c.Rate >= 0 && c.Rate <= maxRate): // NaN too
		return fmt.Errorf("the rate must be in [0, %g] journeys per second, got %v", float64(maxRate), c.Rate)
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"retry", c.RetryRatio}, {"checkout", c.CheckoutRatio}, {"cancel", c.CancelRatio}, {"abandon", c.AbandonRatio}, {"lose", c.LoseRatio}} {
		if !(r.v >= 0 && r.v <= 1) { // NaN too
			return fmt.Errorf("the %s ratio must be in [0, 1], got %v", r.name, r.v)
		}
	}
	if sum := c.CheckoutRatio + c.CancelRatio + c.AbandonRatio; sum > 1+ratioSlack || sum < 1-ratioSlack {
		return fmt.Errorf("checkout %v + cancel %v + abandon %v ratios = %v: they split the acknowledged reservations and must add up to 1",
			c.CheckoutRatio, c.CancelRatio, c.AbandonRatio, sum)
	}
	return nil
}

// Minter issues an admission token (admission.Mint without the key).
type Minter func(sku, user string, ttl time.Duration, now time.Time) (string, error)
