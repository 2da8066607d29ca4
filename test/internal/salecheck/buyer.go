package salecheck

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
)

// Buyer is one person with an admission token from `flashsale token`,
// calling a sale's reserve API.
type Buyer struct {
	User   string
	token  string
	url    string
	sku    string
	client *http.Client
}

// NewBuyer mints user's admission token with bin (the flashsale binary) and
// the sale's key file; the buyer calls url (the reserve Service) through
// client.
func NewBuyer(t testing.TB, bin, keyFile, url, sku, user string, client *http.Client) *Buyer {
	t.Helper()
	out, err := exec.Command(bin, "token", "--sku", sku, "--user", user, "--ttl", "10m", "--key-file", keyFile).Output()
	if err != nil {
		t.Fatalf("flashsale token: %v", err)
	}
	return &Buyer{User: user, token: strings.TrimSpace(string(out)), url: url, sku: sku, client: client}
}

// Answer is an HTTP answer of the reserve API (Status 0: no answer, Code
// says why).
type Answer struct {
	Status        int
	Code          string `json:"code"`
	ReservationID string `json:"reservation_id"`
	OrderStatus   string `json:"status"`
}

func (b *Buyer) call(t testing.TB, path string, body any) Answer {
	t.Helper()
	j, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, b.url+path, bytes.NewReader(j))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+b.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	if err != nil {
		return Answer{Status: 0, Code: err.Error()}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := Answer{Status: resp.StatusCode}
	_ = json.Unmarshal(raw, &a)
	return a
}

// Reserve asks for one unit with the given idempotency key.
func (b *Buyer) Reserve(t testing.TB, key string) Answer {
	t.Helper()
	return b.call(t, "/api/v1/flash-sale/reserve",
		map[string]any{"item_id": b.sku, "user_id": b.User, "quantity": 1, "idempotency_key": key})
}

// Checkout pays for a reservation.
func (b *Buyer) Checkout(t testing.TB, reservationID string) Answer {
	t.Helper()
	return b.call(t, "/api/v1/flash-sale/checkout",
		map[string]any{"reservation_id": reservationID, "payment_token": "pay-" + b.User})
}
