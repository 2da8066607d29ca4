package api

import (
	"encoding/json"
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
