package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/types"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// controllerLedgerConns bounds each FlashSale's ledger pool in the operator: it
// runs a few queries per reconcile, and one pool per sale must not exhaust
// PostgreSQL's connections.
const controllerLedgerConns = 4

// campaignConn is the controller's open connections to one FlashSale's Redis and
// ledger, reused across reconciles and replaced when a Secret or the spec changes.
type campaignConn struct {
	key    string // fingerprint of the references and engine config
	stores string // fingerprint of the Redis and ledger references alone
	rdb    redis.UniversalClient
	engine *engine.Engine
	runIDs map[string]string // Redis run ids seen at the last healthy check
	// ledgerDown: the last reconcile to say found the ledger not answering
	// on these connections (see noteLedger).
	ledgerDown atomic.Bool
	// rebuild is the rebuild running on these connections, or the last one
	// until a reconcile reported its outcome.
	rebuild atomic.Pointer[rebuildRun]
	// failed is the backoff of rebuilds that fail in a row (rebuildFailed).
	// Only the reconcile touches it, and interrupted: the rebuild a change
	// of connections stopped, whose loss the next one is run for.
	failed      rebuildBackoff
	interrupted *rebuildRun
	// replacementTold is the failure, and the Secrets' values, of
	// replacements of these connections already warned about (connect).
	replacementTold string
}

// noteLedger keeps what a reconcile found of the ledger on the connections it
// used: a later reconcile that stops at Redis before any ledger query asks the
// ledger again only if it did not answer (a ping tells nothing of a ledger
// that refused the operator or holds another sale's data). The connections
// are the finder's own memory: a new process opens new ones, which reach the
// ledger or fail.
func (c *campaignConn) noteLedger(fs *flashsalev1alpha1.FlashSale, f *facts) {
	switch {
	case ledgerUnreachable(fs, f.outage) || ledgerUnreachable(fs, f.rebuildErr):
		c.ledgerDown.Store(true)
	case f.ledgerOK:
		c.ledgerDown.Store(false)
	}
}

func (c *campaignConn) close() {
	// A rebuild must not write on after the sale is deleted, or on
	// connections its Secrets no longer name.
	if run := c.rebuild.Load(); run != nil {
		run.stop()
	}
	c.engine.Close()
	_ = c.rdb.Close()
}

// runIDsChanged compares the Redis servers holding the sale's shards now with
// those verified before (this connection's memory, else the ledger's record,
// which survives an operator restart). It reports why the data may be older
// than the ledger: a server restarted (its run id changed), or a server not
// seen before holds shards (a failover promoted a replica). Nothing known
// before (a new sale) is no change, and neither is a known server reached under
// another address (a new DNS name or IP for the same process: same run id).
func (c *campaignConn) runIDsChanged(recorded []flashsalev1alpha1.RedisServerStatus, now map[string]string) (string, bool) {
	known := map[string]string{}
	for _, srv := range recorded {
		known[srv.Address] = srv.RunID
	}
	maps.Copy(known, c.runIDs)
	if len(known) == 0 {
		return "", false
	}
	knownIDs := map[string]bool{}
	for _, id := range known {
		knownIDs[id] = true
	}
	for _, addr := range slices.Sorted(maps.Keys(now)) {
		was, ok := known[addr]
		switch {
		case knownIDs[now[addr]]:
			// The same server process as one checked before.
		case !ok:
			return fmt.Sprintf("Redis server %s now holds shards of the sale: its data may be older than the ledger", addr), true
		case was != now[addr]:
			return fmt.Sprintf("Redis server %s restarted (its run id changed): its data may be older than the ledger", addr), true
		}
	}
	return "", false
}

func (c *campaignConn) rememberRunIDs(ids map[string]string) { c.runIDs = maps.Clone(ids) }

// redisServers is the status form of run ids, sorted by address.
func redisServers(ids map[string]string) []flashsalev1alpha1.RedisServerStatus {
	if len(ids) == 0 {
		return nil
	}
	out := make([]flashsalev1alpha1.RedisServerStatus, 0, len(ids))
	for _, addr := range slices.Sorted(maps.Keys(ids)) {
		out = append(out, flashsalev1alpha1.RedisServerStatus{Address: addr, RunID: ids[addr]})
	}
	return out
}

// connections caches one campaignConn per FlashSale.
type connections struct {
	mu    sync.Mutex
	byKey map[types.NamespacedName]*campaignConn
}

// get returns the open connection for a FlashSale, opening (or replacing) it when
// needed. Opening the ledger applies its migrations. A connection being
// replaced stays (see cached) until its successor is open.
//
// A rebuild running on the connection keeps it while the sale's Redis and
// ledger stay the same: an edit of the spec or of the admission key would
// otherwise stop the rebuild and start it over, the sale closed all along.
// The change is taken once the rebuild ends, and its outcome is handed to the
// new connection, so that it is reported and recorded: also when the stores'
// references changed (a rotated password or certificate), whose new
// connection would otherwise rebuild again what was just rebuilt.
func (cs *connections) get(ctx context.Context, name types.NamespacedName, refs references, cfg engine.Config) (*campaignConn, error) {
	key, stores := refs.fingerprint()+"|"+cfgKey(cfg), refs.storeFingerprint()
	cs.mu.Lock()
	if c, ok := cs.byKey[name]; ok && (c.key == key ||
		c.stores == stores && c.rebuilding() && c.engine.Config().CampaignID == cfg.CampaignID) {
		cs.mu.Unlock()
		return c, nil
	}
	cs.mu.Unlock()
	// Opened without the lock: a sale whose PostgreSQL does not answer must
	// not hold up the others' reconciles. One sale is never reconciled twice
	// at once, so nobody else opens this one meanwhile.
	// Dial checks that Redis answers: without that, a Redis Secret changed
	// to a dead address or a wrong password would replace connections that
	// work.
	rdb := refs.redis.Client()
	e, err := engine.Dial(ctx, cfg, rdb, refs.postgresDSN, controllerLedgerConns)
	if err != nil {
		_ = rdb.Close()
		if errors.Is(err, engine.ErrLedger) {
			return nil, &ledgerError{err}
		}
		return nil, err
	}
	c := &campaignConn{key: key, stores: stores, rdb: rdb, engine: e}
	cs.mu.Lock()
	old := cs.byKey[name]
	if cs.byKey == nil {
		cs.byKey = map[types.NamespacedName]*campaignConn{}
	}
	cs.byKey[name] = c
	cs.mu.Unlock()
	// Replaced (a Secret or the spec changed): closed outside the lock, as
	// closing waits for the connection's rebuild to stop, and other sales'
	// reconciles must not wait for it. This sale's reconcile does: no new
	// rebuild starts before the old one has stopped.
	if old != nil {
		old.close()
		// Stopped or ended, the run is reported on the new connections (a
		// failure is retried; a success recorded, not run again), unless
		// they are another sale's of the same name.
		if run := old.rebuild.Load(); run != nil && old.engine.Config().CampaignID == cfg.CampaignID {
			c.rebuild.Store(run)
		}
	}
	return c, nil
}

// rebuilding reports a rebuild running on the connection.
func (c *campaignConn) rebuilding() bool {
	run := c.rebuild.Load()
	return run != nil && !run.over()
}

// cached returns the FlashSale's open connection, if any, whatever its Secrets
// say now.
func (cs *connections) cached(name types.NamespacedName) *campaignConn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.byKey[name]
}

func (cs *connections) drop(name types.NamespacedName) {
	cs.mu.Lock()
	c, ok := cs.byKey[name]
	delete(cs.byKey, name)
	cs.mu.Unlock()
	if ok {
		c.close() // outside the lock, as in get
	}
}

func cfgKey(c engine.Config) string {
	c.IDSecret = nil // part of the references fingerprint already
	return fmt.Sprintf("%+v", c)
}

// ledgerError marks a failure to reach PostgreSQL.
type ledgerError struct{ err error }

func (e *ledgerError) Error() string { return "PostgreSQL ledger unreachable: " + e.err.Error() }
func (e *ledgerError) Unwrap() error { return e.err }
