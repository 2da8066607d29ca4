package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

func dialConfig() engine.Config {
	return engine.Config{
		CampaignID: "c-" + randomID(), Namespace: "shop", Name: "drop", SKU: "itm-ps5-pro",
		Allocation: 40, Shards: 2, MaxPerUser: 1, TTL: time.Minute, StealProbes: 1,
		IDSecret: []byte("0123456789abcdef0123456789abcdef"),
	}
}

// Dial opens the ledger and owns it: the engine answers for the campaign's
// allocation, and Close closes the ledger too.
func TestDialOwnsTheLedger(t *testing.T) {
	ctx := context.Background()
	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	cfg := dialConfig()
	e, err := engine.Dial(ctx, cfg, standaloneClient(t, sharedRedis.Addr()), dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Seed(ctx, engine.StateOpen); err != nil {
		t.Fatal(err)
	}
	if n, err := e.Allocation(ctx); err != nil || n != cfg.Allocation {
		t.Fatalf("Allocation = %d, %v; want %d", n, err, cfg.Allocation)
	}
	if err := e.PingLedger(ctx); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if err := e.PingLedger(ctx); err == nil {
		t.Fatal("the ledger answers after Close: Dial's engine must close the ledger it opened")
	}
}

// A DSN that cannot be parsed is a ledger error that does not quote it, and
// nothing is written to Redis; Redis not answering is said as such.
func TestDialRefusals(t *testing.T) {
	ctx := context.Background()
	rdb := standaloneClient(t, sharedRedis.Addr())
	cfg := dialConfig()
	_, err := engine.Dial(ctx, cfg, rdb, "postgres://flash:s3cret@[::1/ledger", 2)
	if !errors.Is(err, engine.ErrLedger) || !errors.Is(err, engine.ErrBadDSN) {
		t.Fatalf("bad DSN: err = %v; want ErrLedger and ErrBadDSN", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("the error quotes the DSN: %v", err)
	}
	if keys := scanKeys(t, rdb, "*"+cfg.CampaignID+"*"); len(keys) > 0 {
		t.Fatalf("a refused Dial wrote %v", keys)
	}

	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	// Port 1 on loopback: nothing listens there.
	_, err = engine.Dial(ctx, cfg, standaloneClient(t, "127.0.0.1:1"), dsn, 2)
	if err == nil || errors.Is(err, engine.ErrLedger) || !strings.HasPrefix(err.Error(), "redis: ") {
		t.Fatalf("Redis down: err = %v; want a Redis error", err)
	}
}
