// Command bare is the reference handler of the reserve benchmark: it serves
// POST /api/v1/flash-sale/reserve with plain net/http and, with the default
// --backend=script, ONE call of the product's reserve script
// (stock.Store.Reserve), and nothing else: no admission token check, no rate
// limit, no metrics, no ledger. What `flashsale reserve` does beyond this is
// what the benchmark's ratio prices.
//
// The other backends are the benchmark's other references behind the same
// route, body and answers:
//
//   - decr: one one-command script (DECR of the home shard's counter): the
//     floor of HTTP plus one Redis script call;
//   - pg-buckets: the PostgreSQL design an engineer who knows the hot-row
//     problem would build (buckets.go): N bucket rows per SKU, a conditional
//     decrement on a random bucket with up to --probes other buckets tried,
//     and the order row inserted in the same transaction, durable before 201.
//
// It reads the same FLASHSALE_* environment as `flashsale reserve` (so both
// get the same Redis client settings, and the script backend pipelines its
// calls as reserve pods do: FLASHSALE_RESERVE_PIPELINE and
// FLASHSALE_RESERVE_PIPELINES, the product's defaults when unset) and
// listens on FLASHSALE_LISTEN.
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

	reservecmd "github.com/flashsale-dev/flashsale-operator/internal/cmd/reserve"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// maxBody is the product's default body limit, so both decode the same bytes.
const maxBody = 16 << 10

type handler struct {
	store    *stock.Store
	campaign string
	shards   int
	keys     *stock.Keyer
	mode     stock.Mode
	ttl      time.Duration
	maxUser  int
}

func main() {
	var camp config.Campaign
	fs := pflag.NewFlagSet("bare", pflag.ExitOnError)
	camp.AddFlags(fs)
	listen := fs.String("listen", os.Getenv(config.EnvListen), "address to serve on (env "+config.EnvListen+")")
	backend := fs.String("backend", "script", "script (the product's reserve script), decr (a one-command script) or pg-buckets (PostgreSQL bucket rows)")
	var pipe stock.PipelineConfig
	var env config.EnvDefaults
	fs.IntVar(&pipe.MaxBatch, "reserve-pipeline", env.Int(config.EnvReservePipeline, reservecmd.DefaultReservePipeline), "most script calls in one pipeline, as reserve pods (0 or 1: each alone)")
	fs.IntVar(&pipe.InFlight, "reserve-pipelines", env.Int(config.EnvReservePipelines, reservecmd.DefaultReservePipelines), "most pipelines out to one Redis server at once, as reserve pods")
	var bk bucketOptions
	bk.addFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if err := camp.Complete(); err != nil {
		fmt.Fprintln(os.Stderr, "bare:", err)
		os.Exit(2)
	}
	if err := errors.Join(env.Err(), pipe.Validate()); err != nil {
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
		store: stock.New(rdb, cfg.CampaignID, cfg.Shards).WithPipeline(pipe), campaign: cfg.CampaignID, shards: cfg.Shards,
		keys: stock.NewKeyer(cfg.IDSecret), mode: mode, ttl: cfg.TTL, maxUser: cfg.MaxPerUser,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	reserve := h.reserve
	ready := func(ctx context.Context) error { return rdb.Ping(ctx).Err() }
	switch *backend {
	case "script":
	case "decr":
		reserve = (&decrHandler{rdb: rdb, campaign: cfg.CampaignID, shards: cfg.Shards, keys: stock.NewKeyer(cfg.IDSecret)}).reserve
	case "pg-buckets":
		b, err := newBucketHandler(ctx, bk, camp.PostgresDSN, camp.SKU, cfg.CampaignID, cfg.IDSecret, cfg.TTL)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bare:", err)
			os.Exit(1)
		}
		defer b.close()
		reserve, ready = b.reserve, b.ping
	default:
		fmt.Fprintf(os.Stderr, "bare: --backend %q: want script, decr or pg-buckets\n", *backend)
		os.Exit(2)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/flash-sale/reserve", reserve)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
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

// decode reads the body as every backend does; false: answered 400.
func decode(w http.ResponseWriter, r *http.Request) (reserveBody, bool) {
	var in reserveBody
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&in); err != nil || in.UserID == "" || in.IdempotencyKey == "" {
		writeError(w, http.StatusBadRequest, "BAD_REQUEST", "bad body")
		return in, false
	}
	if in.Quantity < 1 {
		in.Quantity = 1
	}
	return in, true
}

// reserved answers a reservation (201) or its replay (200), as the product does.
func reserved(w http.ResponseWriter, replay bool, id string, expiry time.Time) {
	status := http.StatusCreated
	if replay {
		status = http.StatusOK
	}
	writeJSON(w, status, map[string]string{
		"reservation_id": id,
		"expires_at":     expiry.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		"status":         "reserved",
	})
}

func soldOut(w http.ResponseWriter) {
	writeError(w, http.StatusGone, "SOLD_OUT", "sold out")
}

func (h *handler) reserve(w http.ResponseWriter, r *http.Request) {
	in, ok := decode(w, r)
	if !ok {
		return
	}
	// The reservation key and the home shard are how the engine addresses the
	// script call; they are part of the one call, not extra work.
	key := h.keys.Key(h.campaign, in.UserID, in.IdempotencyKey)
	home := stock.HomeShard(in.UserID, h.shards)
	res, err := h.store.Reserve(r.Context(), stock.ReserveRequest{
		Shard: home, Home: home, Mode: h.mode, User: in.UserID, Key: key,
		Quantity: in.Quantity, MaxPerUser: h.maxUser, TTL: h.ttl,
	})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "CLOSED", err.Error())
		return
	}
	switch res.Code {
	case stock.Reserved, stock.Replay:
		reserved(w, res.Code == stock.Replay, stock.FormatID(home, key), time.UnixMilli(res.ExpiryMs))
	case stock.SoldOut, stock.Claimed:
		soldOut(w)
	case stock.Limit:
		writeError(w, http.StatusConflict, "LIMIT_EXCEEDED", "limit")
	default:
		writeError(w, http.StatusServiceUnavailable, "CLOSED", res.Code.String()+" "+res.Status)
	}
}

// writeError answers with the product's error shape.
func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]string{"code": code, "message": message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
