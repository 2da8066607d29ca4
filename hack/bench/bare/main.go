// Command bare is the reference handler of the reserve benchmark: it serves
// POST /api/v1/flash-sale/reserve with plain net/http and ONE call of the
// product's reserve script (stock.Store.Reserve), and nothing else: no
// admission token check, no rate limit, no metrics, no ledger. What
// `flashsale reserve` does beyond this is what the benchmark's ratio prices.
//
// It reads the same FLASHSALE_* environment as `flashsale reserve` (so both
// get the same Redis client settings) and listens on FLASHSALE_LISTEN.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// maxBody is the product's default body limit, so both decode the same bytes.
const maxBody = 16 << 10

type handler struct {
	store    *stock.Store
	campaign string
	shards   int
	secret   []byte
	mode     stock.Mode
	ttl      time.Duration
	maxUser  int
}

func main() {
	var camp config.Campaign
	fs := pflag.NewFlagSet("bare", pflag.ExitOnError)
	camp.AddFlags(fs)
	listen := fs.String("listen", os.Getenv(config.EnvListen), "address to serve on (env "+config.EnvListen+")")
	_ = fs.Parse(os.Args[1:])
	if err := camp.Complete(); err != nil {
		fmt.Fprintln(os.Stderr, "bare:", err)
		os.Exit(2)
	}
	rdb := camp.Redis.Client()
	defer rdb.Close()
	cfg := camp.EngineConfig()
	// The engine's first call on the home shard uses claim mode when it may
	// steal; the bare handler makes that same call.
	mode := stock.ModeHome
	if cfg.StealProbes > 0 && cfg.Shards > 1 {
		mode = stock.ModeClaim
	}
	h := &handler{
		store: stock.New(rdb, cfg.CampaignID, cfg.Shards), campaign: cfg.CampaignID, shards: cfg.Shards,
		secret: cfg.IDSecret, mode: mode, ttl: cfg.TTL, maxUser: cfg.MaxPerUser,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/flash-sale/reserve", h.reserve)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := rdb.Ping(r.Context()).Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare:", err)
		os.Exit(1)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		fmt.Fprintln(os.Stderr, "bare:", err)
		os.Exit(1)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "bare:", err)
		os.Exit(1)
	}
}

type reserveBody struct {
	ItemID         string `json:"item_id"`
	UserID         string `json:"user_id"`
	Quantity       int    `json:"quantity"`
	IdempotencyKey string `json:"idempotency_key"`
}

func (h *handler) reserve(w http.ResponseWriter, r *http.Request) {
	var in reserveBody
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&in); err != nil || in.UserID == "" || in.IdempotencyKey == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"code": "BAD_REQUEST", "message": "bad body"})
		return
	}
	if in.Quantity < 1 {
		in.Quantity = 1
	}
	// The reservation key and the home shard are how the engine addresses the
	// script call; they are part of the one call, not extra work.
	key := stock.ReservationKey(h.secret, h.campaign, in.UserID, in.IdempotencyKey)
	home := stock.HomeShard(in.UserID, h.shards)
	res, err := h.store.Reserve(r.Context(), stock.ReserveRequest{
		Shard: home, Home: home, Mode: h.mode, User: in.UserID, Key: key,
		Quantity: in.Quantity, MaxPerUser: h.maxUser, TTL: h.ttl,
	})
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"code": "CLOSED", "message": err.Error()})
		return
	}
	switch res.Code {
	case stock.Reserved, stock.Replay:
		status := http.StatusCreated
		if res.Code == stock.Replay {
			status = http.StatusOK
		}
		writeJSON(w, status, map[string]string{
			"reservation_id": stock.FormatID(home, key),
			"expires_at":     time.UnixMilli(res.ExpiryMs).UTC().Format("2006-01-02T15:04:05.000Z07:00"),
			"status":         "reserved",
		})
	case stock.SoldOut, stock.Claimed:
		writeJSON(w, http.StatusGone, map[string]string{"code": "SOLD_OUT", "message": "sold out"})
	case stock.Limit:
		writeJSON(w, http.StatusConflict, map[string]string{"code": "LIMIT_EXCEEDED", "message": "limit"})
	default:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"code": "CLOSED", "message": res.Code.String() + " " + res.Status})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
