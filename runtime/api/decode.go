package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/flashsale-dev/flashsale-operator/internal/plainjson"
)

// Request limits. Ids are bounded so that a buyer cannot make Redis keys, ledger
// rows or log lines large; the body limit bounds the decoder's work.
const (
	DefaultMaxBodyBytes = 16 << 10
	maxIDLen            = 128 // item_id, user_id, idempotency_key
	maxReservationIDLen = 64  // ids are "<shard>.<16 chars>"
	maxPaymentTokenLen  = 256
)

// ReserveRequest is the body of POST /api/v1/flash-sale/reserve.
type ReserveRequest struct {
	ItemID         string `json:"item_id"`
	UserID         string `json:"user_id"`
	Quantity       int    `json:"quantity"`
	IdempotencyKey string `json:"idempotency_key"`
}

// CheckoutRequest is the body of POST /api/v1/flash-sale/checkout.
type CheckoutRequest struct {
	ReservationID string `json:"reservation_id"`
	PaymentToken  string `json:"payment_token"`
}

// The wire forms have pointer fields so that a missing field is told apart from a
// zero value.
type reserveWire struct {
	ItemID         *string `json:"item_id"`
	UserID         *string `json:"user_id"`
	Quantity       *int    `json:"quantity"`
	IdempotencyKey *string `json:"idempotency_key"`
}

type checkoutWire struct {
	ReservationID *string `json:"reservation_id"`
	PaymentToken  *string `json:"payment_token"`
}

// plainWire is a wire form that takes the plain form of its object
// (plainjson.Object): decodeJSON reads such a body without encoding/json. A
// member it does not know, of the wrong kind or given twice is refused, so
// that the general path answers it.
type plainWire interface {
	plainMember(key []byte, v plainjson.Value) bool
	reset()
}

func (w *reserveWire) plainMember(key []byte, v plainjson.Value) bool {
	switch string(key) {
	case "item_id":
		return plainString(&w.ItemID, v)
	case "user_id":
		return plainString(&w.UserID, v)
	case "idempotency_key":
		return plainString(&w.IdempotencyKey, v)
	case "quantity":
		q := int(v.Int)
		if w.Quantity != nil || !v.IsInt || int64(q) != v.Int { // overflow on 32 bits: the general path's error
			return false
		}
		w.Quantity = &q
		return true
	}
	return false
}

func (w *reserveWire) reset() { *w = reserveWire{} }

func (w *checkoutWire) plainMember(key []byte, v plainjson.Value) bool {
	switch string(key) {
	case "reservation_id":
		return plainString(&w.ReservationID, v)
	case "payment_token":
		return plainString(&w.PaymentToken, v)
	}
	return false
}

func (w *checkoutWire) reset() { *w = checkoutWire{} }

func plainString(dst **string, v plainjson.Value) bool {
	if *dst != nil || v.IsInt {
		return false
	}
	s := string(v.Str)
	*dst = &s
	return true
}

// decodeReserve reads and checks a reserve body; maxQuantity is the sale's maxPerUser.
func decodeReserve(body io.Reader, maxQuantity int) (ReserveRequest, *apiError) {
	var w reserveWire
	if e := decodeJSON(body, &w); e != nil {
		return ReserveRequest{}, e
	}
	var req ReserveRequest
	for _, f := range []struct {
		name string
		src  *string
		dst  *string
		max  int
	}{
		{"item_id", w.ItemID, &req.ItemID, maxIDLen},
		{"user_id", w.UserID, &req.UserID, maxIDLen},
		{"idempotency_key", w.IdempotencyKey, &req.IdempotencyKey, maxIDLen},
	} {
		v, e := requiredString(f.name, f.src, f.max)
		if e != nil {
			return ReserveRequest{}, e
		}
		*f.dst = v
	}
	if w.Quantity == nil {
		return ReserveRequest{}, badRequest("quantity is required")
	}
	if q := *w.Quantity; q < 1 || q > maxQuantity {
		return ReserveRequest{}, badRequest(fmt.Sprintf("quantity must be 1..%d (the sale's limit per buyer), got %d", maxQuantity, q))
	}
	req.Quantity = *w.Quantity
	return req, nil
}

// decodeCheckout reads and checks a checkout body.
func decodeCheckout(body io.Reader) (CheckoutRequest, *apiError) {
	var w checkoutWire
	if e := decodeJSON(body, &w); e != nil {
		return CheckoutRequest{}, e
	}
	id, e := requiredString("reservation_id", w.ReservationID, maxReservationIDLen)
	if e != nil {
		return CheckoutRequest{}, e
	}
	pay, e := requiredString("payment_token", w.PaymentToken, maxPaymentTokenLen)
	if e != nil {
		return CheckoutRequest{}, e
	}
	return CheckoutRequest{ReservationID: id, PaymentToken: pay}, nil
}

// decodeJSON decodes exactly one JSON object with only known fields into v
// (a pointer to a wire struct), each spelled exactly as documented and given
// at most once. encoding/json alone would take "ITEM_ID" for item_id and the
// last of two item_ids.
func decodeJSON(body io.Reader, v plainWire) *apiError {
	raw, err := io.ReadAll(body) // bounded by the server's MaxBytesReader
	if err != nil {
		return decodeError(err)
	}
	if plainjson.Object(raw, v.plainMember) {
		return nil
	}
	v.reset() // whatever the plain form set; the general path decides
	return decodeGeneral(raw, v)
}

// decodeGeneral is decodeJSON for any body: it gives every error message.
func decodeGeneral(raw []byte, v any) *apiError {
	if e := checkKeys(raw, fieldNames(v)); e != nil {
		return e
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return decodeError(err)
		}
		return badRequest("the body must hold exactly one JSON object")
	}
	return nil
}

// checkKeys refuses a top-level key that is not one of fields exactly, or
// that comes twice. A body that is not an object, or not JSON, is left to
// the decoder's own messages.
func checkKeys(raw []byte, fields []string) *apiError {
	keys, _ := plainjson.ObjectKeys(raw) // the keys before any fault: the rest is the decoder's
	seen := make(map[string]bool, len(fields))
	for _, k := range keys {
		name := clip(strconv.Quote(k))
		if !slices.Contains(fields, k) {
			for _, f := range fields {
				if strings.EqualFold(f, k) {
					return badRequest(fmt.Sprintf("unknown field %s: field names are case-sensitive, this one is %q", name, f))
				}
			}
			return badRequest("unknown field " + name)
		}
		if seen[k] {
			return badRequest("duplicate field " + name)
		}
		seen[k] = true
	}
	return nil
}

// fieldNames lists the JSON names of the fields of the struct v points to.
func fieldNames(v any) []string {
	t := reflect.TypeOf(v).Elem()
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

func decodeError(err error) *apiError {
	var (
		tooLarge *http.MaxBytesError
		syntax   *json.SyntaxError
		typ      *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &tooLarge):
		return errorf(http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("the body exceeds %d bytes", tooLarge.Limit))
	case errors.Is(err, io.EOF):
		return badRequest("the body is empty: a JSON object is required")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("malformed JSON: unexpected end of the body")
	case errors.As(err, &syntax):
		return badRequest(fmt.Sprintf("malformed JSON at byte %d", syntax.Offset))
	case errors.As(err, &typ):
		if typ.Field == "" {
			return badRequest("the body must be a JSON object")
		}
		return badRequest(fmt.Sprintf("%s must be %s, got %s", typ.Field, jsonKind(typ.Type.Kind().String()), clip(typ.Value)))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return badRequest("unknown field " + clip(strings.TrimPrefix(err.Error(), "json: unknown field ")))
	}
	return badRequest("malformed JSON body")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "int", "int64":
		return "an integer"
	}
	return goKind
}

// requiredString checks a string field: present, non-empty, at most max characters
// of valid UTF-8 without control characters.
func requiredString(name string, v *string, max int) (string, *apiError) {
	switch {
	case v == nil:
		return "", badRequest(name + " is required")
	case *v == "":
		return "", badRequest(name + " must not be empty")
	case utf8.RuneCountInString(*v) > max:
		return "", badRequest(fmt.Sprintf("%s must be at most %d characters", name, max))
	}
	for _, r := range *v {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return "", badRequest(name + " must be valid UTF-8 without control characters")
		}
	}
	return *v, nil
}

// clip bounds client-supplied text echoed in error messages.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "..."
}
