package storm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// fakeAPI is an in-memory reserve API with the routes and answers of
// docs/api.md: enough stock logic to check what the storm counts.
type fakeAPI struct {
	mu        sync.Mutex
	stock     int
	byKey     map[string]string // user/key → reservation id
	holder    map[string]string // reservation id → user
	held      map[string]int    // user → units held
	status    map[string]string // reservation id → reserved, paid, cancelled
	issued    []string          // ids answered with 201
	seq       int
	requests  atomic.Int64
	badTokens atomic.Int64

	replayNewID   bool          // break idempotency on purpose
	replayAnswer  string        // "201" or an error code: answer replays so (not recognised)
	expiresIn     time.Duration // with it, reservations carry expires_at = now + expiresIn
	busyFirst     bool          // answer 503 + Retry-After to the first attempt of each key
	busySeen      map[string]bool
	dropResponses atomic.Int64         // close this many connections after doing the work
	expiry        map[string]time.Time // reservation id → expires_at, with expiresIn
	unlisted      map[string]bool      // reservation ids the buyer's list leaves out (on purpose)
	listBusy      bool                 // answer every list 503
	listDelay     time.Duration        // answer lists this late
}

func newFakeAPI(stock int) *fakeAPI {
	return &fakeAPI{stock: stock, byKey: map[string]string{}, holder: map[string]string{}, held: map[string]int{},
		status: map[string]string{}, busySeen: map[string]bool{}, expiry: map[string]time.Time{}, unlisted: map[string]bool{}}
}

func fakeMint(sku, user string, _ time.Duration, _ time.Time) (string, error) {
	return "tok:" + sku + ":" + user, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func apiErr(w http.ResponseWriter, status int, code string) {
	writeJSON(w, status, map[string]string{"code": code, "message": strings.ToLower(code)})
}

// admit counts a buyer request and reads its token's user, answering 401
// when the token is not one fakeMint makes.
func (f *fakeAPI) admit(w http.ResponseWriter, r *http.Request) (string, bool) {
	f.requests.Add(1)
	user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer tok:sku-1:")
	if !ok {
		f.badTokens.Add(1)
		apiErr(w, 401, "ADMISSION_INVALID")
	}
	return user, ok
}

func (f *fakeAPI) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/flash-sale/reserve", func(w http.ResponseWriter, r *http.Request) {
		user, ok := f.admit(w, r)
		if !ok {
			return
		}
		var req struct {
			ItemID, UserID, IdempotencyKey string `json:"-"`
		}
		var wire map[string]any
		if err := json.NewDecoder(r.Body).Decode(&wire); err != nil {
			apiErr(w, 400, "BAD_REQUEST")
			return
		}
		req.ItemID, _ = wire["item_id"].(string)
		req.UserID, _ = wire["user_id"].(string)
		req.IdempotencyKey, _ = wire["idempotency_key"].(string)
		if req.UserID != user || req.ItemID != "sku-1" || wire["quantity"] != 1.0 {
			apiErr(w, 400, "BAD_REQUEST")
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		k := user + "/" + req.IdempotencyKey
		if f.busyFirst && !f.busySeen[k] {
			f.busySeen[k] = true
			w.Header().Set("Retry-After", "1")
			apiErr(w, 503, "UNAVAILABLE")
			return
		}
		if id, ok := f.byKey[k]; ok {
			switch f.replayAnswer {
			case "":
			case "201":
				writeJSON(w, 201, f.reservation(id))
				return
			default:
				apiErr(w, 409, f.replayAnswer)
				return
			}
			if f.replayNewID {
				id += "x"
			}
			writeJSON(w, 200, f.reservation(id))
			return
		}
		switch {
		case f.held[user] > 0:
			apiErr(w, 409, "LIMIT_EXCEEDED")
			return
		case f.stock == 0:
			apiErr(w, 410, "SOLD_OUT")
			return
		}
		f.stock--
		f.seq++
		id := fmt.Sprintf("%d.r%06d", f.seq%4, f.seq)
		f.byKey[k], f.holder[id], f.status[id] = id, user, "reserved"
		if f.expiresIn != 0 {
			f.expiry[id] = time.Now().Add(f.expiresIn).Truncate(time.Millisecond)
		}
		f.held[user]++
		f.issued = append(f.issued, id)
		if f.dropResponses.Add(-1) >= 0 {
			// The work is done but the answer is lost, as when a replica dies.
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
		}
		writeJSON(w, 201, f.reservation(id))
	})
	mux.HandleFunc("POST /api/v1/flash-sale/checkout", func(w http.ResponseWriter, r *http.Request) {
		user, ok := f.admit(w, r)
		if !ok {
			return
		}
		var req struct {
			ReservationID string `json:"reservation_id"`
			PaymentToken  string `json:"payment_token"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.PaymentToken == "" {
			apiErr(w, 400, "BAD_REQUEST")
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.holder[req.ReservationID] != user || f.status[req.ReservationID] != "reserved" {
			apiErr(w, 404, "NOT_FOUND")
			return
		}
		f.status[req.ReservationID] = "paid"
		writeJSON(w, 200, map[string]string{"order_id": req.ReservationID, "status": "confirmed"})
	})
	mux.HandleFunc("GET /api/v1/flash-sale/reservations", func(w http.ResponseWriter, r *http.Request) {
		user, ok := f.admit(w, r)
		if !ok {
			return
		}
		time.Sleep(f.listDelay)
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.listBusy {
			apiErr(w, 503, "UNAVAILABLE")
			return
		}
		list := []map[string]any{}
		for _, id := range f.issued {
			if f.holder[id] != user || f.unlisted[id] {
				continue
			}
			switch f.status[id] {
			case "reserved":
				list = append(list, map[string]any{"reservation_id": id, "quantity": 1, "status": "reserved",
					"expires_at": f.expiry[id].UTC().Format("2006-01-02T15:04:05.000Z07:00")})
			case "paid":
				list = append(list, map[string]any{"reservation_id": id, "quantity": 1, "status": "confirmed"})
			}
		}
		writeJSON(w, 200, map[string]any{"reservations": list})
	})
	mux.HandleFunc("DELETE /api/v1/flash-sale/reservations/{id}", func(w http.ResponseWriter, r *http.Request) {
		user, ok := f.admit(w, r)
		if !ok {
			return
		}
		id := r.PathValue("id")
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.holder[id] != user || f.status[id] != "reserved" {
			apiErr(w, 404, "NOT_FOUND")
			return
		}
		f.status[id] = "cancelled"
		f.stock++
		f.held[user]--
		writeJSON(w, 200, map[string]string{"status": "cancelled"})
	})
	return mux
}

func (f *fakeAPI) reservation(id string) map[string]string {
	m := map[string]string{"reservation_id": id, "status": "reserved"}
	if f.expiresIn != 0 {
		at, ok := f.expiry[id]
		if !ok { // a replay answered with a new id (replayNewID)
			at = time.Now().Add(f.expiresIn)
		}
		m["expires_at"] = at.UTC().Format(time.RFC3339Nano)
	}
	return m
}

func (f *fakeAPI) with(status string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for id, s := range f.status {
		if s == status {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func baseConfig(urls ...string) Config {
	return Config{
		URLs: urls, SKU: "sku-1", Mint: fakeMint, Buyers: 2000, Concurrency: 16,
		RetryRatio: 0.2, CheckoutRatio: 0.5, CancelRatio: 0.2, AbandonRatio: 0.3,
		UserPrefix: "b", Seed: 7, Timeout: 5 * time.Second,
	}
}
