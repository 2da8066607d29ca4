package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

func TestDeleteKeepsLedger(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f := newFixture(t, rdb, withAllocation(10))
		ctx := context.Background()
		ids := reserveMany(t, f, "d", 3)
		if err := f.e.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := f.e.Store().State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			if s.Present || s.Available != 0 {
				t.Fatalf("shard %d still there: %+v", s.Index, s)
			}
		}
		if n, _ := f.e.Store().DeleteAll(ctx); n != 0 {
			t.Fatalf("%d keys left after delete", n)
		}
		// Retried (the operator's finalizer failed later on): nothing left
		// to scan for, and no SCAN sent.
		if c, ok := rdb.(*redis.Client); ok {
			scans := func() string {
				return testharness.InfoField(t, c, "commandstats", "cmdstat_scan")
			}
			before := scans()
			if err := f.e.Delete(ctx); err != nil {
				t.Fatal(err)
			}
			if after := scans(); after != before {
				t.Fatalf("a retried delete scanned Redis again: %s → %s", before, after)
			}
		}
		for _, id := range ids {
			if s := orderStatus(t, f, id); s != ledger.StatusPending {
				t.Fatalf("ledger row %s: %s", id, s)
			}
		}
		c, err := f.l.GetCampaign(ctx, f.cfg.CampaignID)
		if err != nil || c.DeletedAt == nil {
			t.Fatalf("campaign %+v %v", c, err)
		}
	})
}

// A sale deleted before it was ever seeded (its ledger was unreachable the
// whole time) has nothing to clean: Delete succeeds, so the FlashSale's
// finalizer does not block its deletion forever.
func TestDeleteOfACampaignNeverCreated(t *testing.T) {
	f := newFixture(t, standaloneClient(t, sharedRedis.Addr()))
	cfg := f.cfg
	cfg.CampaignID = "c-" + randomID()
	e := openEngine(t, cfg, f.rdb, f.l)
	if err := e.Delete(context.Background()); err != nil {
		t.Fatalf("delete of a campaign the ledger never had: %v", err)
	}
	if _, err := f.l.GetCampaign(context.Background(), cfg.CampaignID); !errors.Is(err, ledger.ErrCampaignNotFound) {
		t.Fatalf("Delete created the campaign: %v", err)
	}
}

// A sale whose ledger Secret points at another database is not cleaned up
// through it: that ledger has no campaign to mark, and the one that has it
// would keep the campaign live, with pending orders nobody sweeps. Delete
// ends the sale, refuses, and deletes nothing; on its own ledger it cleans up.
func TestDeleteRefusesALedgerThatDoesNotKnowTheSale(t *testing.T) {
	rdb := standaloneClient(t, sharedRedis.Addr())
	f := newFixture(t, rdb, withAllocation(10), withShards(2))
	reserveMany(t, f, "held", 2)
	ctx := context.Background()
	wrong := openEngine(t, f.cfg, rdb, newLedger(t, sharedPG))
	if err := wrong.Delete(ctx); !errors.Is(err, engine.ErrLedgerMismatch) {
		t.Fatalf("delete through a ledger without the sale: %v, want ErrLedgerMismatch", err)
	}
	states, err := f.e.Store().State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if !s.Present || s.State != stock.StateEnded {
			t.Fatalf("shard %d after the refused delete: %+v, want present and %s", s.Index, s, stock.StateEnded)
		}
	}
	if c := f.counts(); c.Reserved != 2 || c.Available != 8 {
		t.Fatalf("the refused delete changed the stock: %+v", c)
	}
	if c, err := f.l.GetCampaign(ctx, f.cfg.CampaignID); err != nil || c.DeletedAt != nil {
		t.Fatalf("the sale's own campaign after the refused delete: %+v %v", c, err)
	}
	if err := f.e.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := f.l.GetCampaign(ctx, f.cfg.CampaignID); err != nil || c.DeletedAt == nil {
		t.Fatalf("the sale's own campaign after its delete: %+v %v", c, err)
	}
}
