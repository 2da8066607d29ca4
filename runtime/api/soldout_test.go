package api

import (
	"net/http"
	"strings"
	"testing"
)

// SOLD_OUT to a buyer of more than one unit says that fewer may be left:
// the last unit is still there for a buyer of one.
func TestSoldOutForAQuantitySaysFewerMayBeLeft(t *testing.T) {
	f := newFixture(t, withAllocation(3), withShards(1), withMaxPerUser(2))
	f.reserve("u1", "k", 2)
	r := f.call(http.MethodPost, reservePath, f.token("u2"), reserveBody("u2", "k", 2))
	if e := r.errorBody(t); r.status != http.StatusGone || e.Code != CodeSoldOut || !strings.Contains(e.Message, "fewer may still be reserved") {
		t.Fatalf("two of one unit left: %d %s", r.status, r.body)
	}
	if r := f.call(http.MethodPost, reservePath, f.token("u2"), reserveBody("u2", "k2", 1)); r.status != http.StatusCreated {
		t.Fatalf("one of one unit left: %d %s", r.status, r.body)
	}
	r = f.call(http.MethodPost, reservePath, f.token("u3"), reserveBody("u3", "k", 1))
	if e := r.errorBody(t); r.status != http.StatusGone || e.Code != CodeSoldOut || e.Message != "sold out" {
		t.Fatalf("one of none left: %d %s", r.status, r.body)
	}
}
