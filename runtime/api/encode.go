package api

import "encoding/json"

// appendJSON is json.Marshal of a reservation answer without reflection: the
// one answer every reservation gets. Its strings are the server's own (a
// derived id, a formatted time, a constant), so they need no escaping; a
// string that would is handed to json.Marshal, so the bytes are always
// json.Marshal's.
func (b ReservationBody) appendJSON(dst []byte) ([]byte, error) {
	if !plainJSON(b.ReservationID) || !plainJSON(b.ExpiresAt) || !plainJSON(b.Status) {
		m, err := json.Marshal(b)
		return append(dst, m...), err
	}
	dst = append(dst, `{"reservation_id":"`...)
	dst = append(dst, b.ReservationID...)
	dst = append(dst, `","expires_at":"`...)
	dst = append(dst, b.ExpiresAt...)
	dst = append(dst, `","status":"`...)
	dst = append(dst, b.Status...)
	return append(dst, `"}`...), nil
}

// plainJSON reports whether json.Marshal writes s between quotes unchanged:
// printable ASCII without '"', '\\' and the HTML characters it escapes.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}
