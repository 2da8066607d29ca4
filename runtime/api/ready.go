package api

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// readyz: ready once Redis answered and the ledger has this campaign as
// configured (the controller creates it; this process never does), until the
// campaign is deleted or the process drains. Once ready, Redis or the ledger
// not answering, or answering slowly, leaves it ready: every replica shares
// those servers, so failing readiness would take all of them out of the
// Service at once, and buyers would get refused connections instead of 503
// UNAVAILABLE with Retry-After, and no checkout (which needs only the
// ledger) during a Redis outage.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) string {
	if s.draining.Load() {
		return unavailable("shutting down").write(w)
	}
	if s.confirmed.Load() {
		return s.stillReady(w, r)
	}
	ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
	defer cancel()
	cfg := s.engine.Config()
	if err := s.engine.PingRedis(ctx); err != nil {
		s.log.Warn("not ready: redis does not answer", "err", err)
		return unavailable("redis does not answer").write(w)
	}
	c, err := s.engine.Campaign(ctx)
	switch {
	case errors.Is(err, ledger.ErrCampaignNotFound):
		return unavailable("the campaign is not in the ledger yet").write(w)
	case err != nil:
		s.log.Warn("not ready: the ledger does not answer", "err", err)
		return unavailable("the ledger does not answer").write(w)
	case c.DeletedAt != nil:
		return unavailable("the campaign is deleted").write(w)
	case c.SKU != cfg.SKU || c.Shards != cfg.Shards:
		s.log.Error("not ready: configuration disagrees with the ledger",
			"sku", cfg.SKU, "ledgerSku", c.SKU, "shards", cfg.Shards, "ledgerShards", c.Shards)
		return unavailable("the configuration disagrees with the ledger").write(w)
	}
	s.confirmed.Store(true)
	writeJSON(w, http.StatusOK, StatusBody{Status: "ready"})
	return okOK
}

// stillReady answers readyz once the campaign was confirmed: only its
// deletion takes the replica out. Redis is not asked, and the ledger gets
// half the probe's time, so that a hung server never makes the probe itself
// time out. The ledger's answer is kept for readyRecheck: readyz is reachable
// through the sale's Service by anyone, and a query per request would load
// the ledger and the pool the reservations' writer draws on.
func (s *Server) stillReady(w http.ResponseWriter, r *http.Request) string {
	gone, ok := s.ready.recent(time.Now())
	if !ok {
		gone = s.checkCampaign(r.Context())
		s.ready.done(time.Now(), gone)
	}
	if gone != "" {
		return unavailable(gone).write(w)
	}
	writeJSON(w, http.StatusOK, StatusBody{Status: "ready"})
	return okOK
}

// checkCampaign asks the ledger whether the campaign is still there; it
// returns why not, or "" (also when the ledger does not answer).
func (s *Server) checkCampaign(ctx context.Context) string {
	s.readyChecks.Add(1)
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout/2)
	defer cancel()
	c, err := s.engine.Campaign(ctx)
	switch {
	case errors.Is(err, ledger.ErrCampaignNotFound):
		return "the campaign is not in the ledger"
	case err == nil && c.DeletedAt != nil:
		return "the campaign is deleted"
	case err != nil:
		if ok, suppressed := s.failureLogs.allow("readyz", time.Now()); ok {
			s.log.Warn("the ledger does not answer; still ready", "err", err, "alikeSuppressed", suppressed)
		}
	}
	return ""
}

// readyRecheck is how long a confirmed replica's readyz reuses the ledger's
// last answer: well under the probe's period, so a deleted campaign still
// takes the replica out at the next probe or the one after.
const readyRecheck = time.Second

// readyMemo is the ledger's last answer to stillReady, and whether a query is
// out: requests meanwhile take the last answer instead of queueing queries.
type readyMemo struct {
	mu    sync.Mutex
	at    time.Time
	gone  string
	asked bool // a query is out
}

// recent returns the last answer if it is fresh or a query is out; false
// means the caller asks the ledger (and must call done).
func (m *readyMemo) recent(now time.Time) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.asked || (!m.at.IsZero() && now.Sub(m.at) < readyRecheck) {
		return m.gone, true
	}
	m.asked = true
	return "", false
}

func (m *readyMemo) done(now time.Time, gone string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.at, m.gone, m.asked = now, gone, false
}
