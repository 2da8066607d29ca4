package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The reservation answer's encoder writes json.Marshal's bytes, for the
// server's own strings and for any string that needs escaping.
func TestReservationBodyEncodesAsJSONMarshal(t *testing.T) {
	for _, b := range []ReservationBody{
		{ReservationID: "3.aB-_09xyzXYZ", ExpiresAt: "2026-12-01T09:10:00.123Z", Status: "reserved"},
		{},
		{ReservationID: `a"b\c`, ExpiresAt: "<&>", Status: "\n\x00é\u2028"},
		{ReservationID: "~ !#$%'()*+,-./:;=?@[]^_`{|}", Status: "reserved"},
		{ReservationID: "\x7f", Status: "reserved"},
	} {
		want, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := b.appendJSON(nil)
		if err != nil || string(got) != string(want) {
			t.Errorf("%+v: appendJSON %s (%v), json.Marshal %s", b, got, err, want)
		}
	}
}

func BenchmarkReservationBody(b *testing.B) {
	body := ReservationBody{ReservationID: "3.aB-_09xyzXYZaB-_09xyzXYZaB-_09xyzXYZaB-_0", ExpiresAt: "2026-12-01T09:10:00.123Z", Status: "reserved"}
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(body)
		}
	})
	b.Run("appendJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = body.appendJSON(make([]byte, 0, 128))
		}
	})
}

// BenchmarkWriteJSON is one answer through writeJSON (the recorder's own
// allocations included).
func BenchmarkWriteJSON(b *testing.B) {
	body := ReservationBody{ReservationID: "3.aB-_09xyzXYZaB-_09xyzXYZaB-_09xyzXYZaB-_0", ExpiresAt: "2026-12-01T09:10:00.123Z", Status: "reserved"}
	b.ReportAllocs()
	for b.Loop() {
		writeJSON(httptest.NewRecorder(), http.StatusCreated, body)
	}
}

// Every answer is JSON, not sniffed and not cached, except the availability
// figure, which intermediaries may share for a second.
func TestAnswerHeaders(t *testing.T) {
	f := newFixture(t)
	want := func(name string, r response, cache string) {
		t.Helper()
		for k, v := range map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff", "Cache-Control": cache} {
			if got := r.header.Values(k); len(got) != 1 || got[0] != v {
				t.Errorf("%s: %s %q, want %q", name, k, got, v)
			}
		}
	}
	res := f.call(http.MethodPost, reservePath, f.token("hdr"), reserveBody("hdr", "k", 1))
	if res.status != http.StatusCreated {
		t.Fatalf("reserve: %d %s", res.status, res.body)
	}
	want("a reservation", res, "no-store")
	want("an error", f.call(http.MethodPost, reservePath, "", reserveBody("hdr", "k2", 1)), "no-store")
	want("availability", f.call(http.MethodGet, availabilityPath(testSKU), "", nil), "public, max-age=1")
}
