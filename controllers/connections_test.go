package controllers

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

func TestRunIDsChanged(t *testing.T) {
	status := []flashsalev1alpha1.RedisServerStatus{{Address: "a:6379", RunID: "r1"}, {Address: "b:6379", RunID: "r2"}}
	for _, tc := range []struct {
		name   string
		status []flashsalev1alpha1.RedisServerStatus
		memory map[string]string
		now    map[string]string
		want   string // "" for no change, else a word of the reason
	}{
		{"a new sale", nil, nil, map[string]string{"a:6379": "r1"}, ""},
		{"the same servers", status, nil, map[string]string{"a:6379": "r1", "b:6379": "r2"}, ""},
		{"restarted, seen in status (operator restarted too)", status, nil, map[string]string{"a:6379": "r9", "b:6379": "r2"}, "restarted"},
		{"restarted, seen in memory", nil, map[string]string{"a:6379": "r1"}, map[string]string{"a:6379": "r9"}, "restarted"},
		{"a replica promoted in a failover", status, nil, map[string]string{"a:6379": "r1", "c:6379": "r3"}, "now holds shards"},
		{"a master gone, its slots on a known one", status, nil, map[string]string{"a:6379": "r1"}, ""},
		{"memory is newer than a stale status", status, map[string]string{"a:6379": "r9", "b:6379": "r2"}, map[string]string{"a:6379": "r9", "b:6379": "r2"}, ""},
		{"the same servers under new addresses", status, nil, map[string]string{"redis-0.shop:6379": "r1", "redis-1.shop:6379": "r2"}, ""},
		{"a new address and a new process", status, nil, map[string]string{"redis-0.shop:6379": "r7", "b:6379": "r2"}, "now holds shards"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &campaignConn{runIDs: tc.memory}
			why, changed := c.runIDsChanged(tc.status, tc.now)
			if changed != (tc.want != "") || !strings.Contains(why, tc.want) {
				t.Fatalf("changed %v, why %q; want %q", changed, why, tc.want)
			}
		})
	}
	if got := redisServers(map[string]string{"b:1": "y", "a:1": "x"}); len(got) != 2 || got[0].Address != "a:1" || got[1].RunID != "y" {
		t.Fatalf("redisServers %+v", got)
	}
}

// Replacing a sale's connections waits for their rebuild to stop; other
// sales' lookups must not wait with it.
func TestReplacingConnectionsHoldsUpNoOtherSale(t *testing.T) {
	rds, pg := testharness.Shared(t)
	dsn, err := pg.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	refs := references{redis: config.Redis{Mode: "standalone", Addresses: []string{rds.Addr()}}, postgresDSN: dsn}
	cfg := func(allocation int64) engine.Config {
		return engine.Config{CampaignID: "c-replace", Namespace: "shop", Name: "drop", SKU: "sku",
			Allocation: allocation, Shards: 2, MaxPerUser: 1, TTL: time.Minute,
			IDSecret: []byte("0123456789abcdef0123456789abcdef")}
	}
	var cs connections
	t.Cleanup(func() {
		cs.drop(types.NamespacedName{Namespace: "shop", Name: "drop"})
		cs.drop(types.NamespacedName{Namespace: "shop", Name: "other"})
	})
	sale, other := types.NamespacedName{Namespace: "shop", Name: "drop"}, types.NamespacedName{Namespace: "shop", Name: "other"}
	old, err := cs.get(t.Context(), sale, refs, cfg(10))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.get(t.Context(), other, refs, cfg(10)); err != nil {
		t.Fatal(err)
	}
	// A rebuild on the old connections that stops only when the test says.
	stopping, release := make(chan struct{}), make(chan struct{})
	var once sync.Once // a rebuild is stopped by each connection that holds it
	run := &rebuildRun{cancel: func() { once.Do(func() { close(stopping) }) }, done: release}
	old.rebuild.Store(run)

	// Another ledger: a change of the spec alone would keep the connections
	// until the rebuild ends (TestEditDuringARebuildDoesNotRestartIt).
	moved, err := pg.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	refs.postgresDSN = moved
	replaced := make(chan error, 1)
	go func() {
		_, err := cs.get(context.Background(), sale, refs, cfg(20))
		replaced <- err
	}()
	<-stopping // the replacement waits for the old rebuild to stop
	looked := make(chan *campaignConn, 1)
	go func() { looked <- cs.cached(other) }()
	select {
	case c := <-looked:
		if c == nil {
			t.Fatal("the other sale's connections are gone")
		}
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("another sale's lookup waited for a replaced connection's rebuild to stop")
	}
	select {
	case err := <-replaced:
		t.Fatalf("the replacement returned (%v) before the old connections' rebuild stopped", err)
	default:
	}
	close(release)
	if err := <-replaced; err != nil {
		t.Fatal(err)
	}
	if c := cs.cached(sale); c == nil || c == old {
		t.Fatal("the sale's connections were not replaced")
	}
}
