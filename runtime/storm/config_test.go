package storm

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	ok := baseConfig("http://127.0.0.1:1")
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"no url":       func(c *Config) { c.URLs = nil },
		"bad url":      func(c *Config) { c.URLs = []string{"127.0.0.1:80"} },
		"no sku":       func(c *Config) { c.SKU = "" },
		"no minter":    func(c *Config) { c.Mint = nil },
		"no buyers":    func(c *Config) { c.Buyers = 0 },
		"ratio > 1":    func(c *Config) { c.RetryRatio = 1.5 },
		"ratio < 0":    func(c *Config) { c.CancelRatio, c.AbandonRatio = -0.1, 0.6 },
		"sum below 1":  func(c *Config) { c.AbandonRatio = 0.1 },
		"sum above 1":  func(c *Config) { c.CheckoutRatio = 0.9 },
		"negative dur": func(c *Config) { c.Duration = -time.Second },
		"ratio NaN":    func(c *Config) { c.CheckoutRatio = math.NaN() },
		"lose > 1":     func(c *Config) { c.LoseRatio = 1.5 },
		"lose NaN":     func(c *Config) { c.LoseRatio = math.NaN() },
		"negative qty": func(c *Config) { c.Quantity = -3 },
		"negative ttl": func(c *Config) { c.TokenTTL = -time.Minute },
		"long prefix":  func(c *Config) { c.UserPrefix = strings.Repeat("b", MaxUserPrefix+1) },
	} {
		c := ok
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The buyers' choices depend on the seed, not on scheduling.
