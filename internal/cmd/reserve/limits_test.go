/*
Copyright 2026 The flashsale-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package reserve

import (
	"strings"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

// A process that cannot hold a socket for every buyer it takes in beside
// its own connections says so; one that can, or that takes in any number
// (-1), says nothing. Its own are go-redis's pool to each Redis server, the
// ledger's pool, the writers' and 64 more.
func TestFewFiles(t *testing.T) {
	own := ownFiles(1, ledger.DefaultMaxConns, 2)
	if own != 128+32+2+64 {
		t.Fatalf("ownFiles(1, 32, 2) = %d, want 226", own)
	}
	if got := ownFiles(3, 100, 2); got != 3*128+100+2+64 {
		t.Fatalf("ownFiles(3, 100, 2) = %d: a pool to each of three Redis servers, and the ledger's of 100", got)
	}
	for _, c := range []struct {
		limit       uint64
		maxInFlight int
		want        string // "" for none
	}{
		{1024, 4096, "this process may open 1024 files: fewer than the 4096 buyers"},
		{1024, 16384, "fewer than the 16384 buyers --max-in-flight takes in at once and the 226 its own connections may take"},
		{4096, 4096, "it holds at most 3870 buyers' connections"},
		{uint64(4096 + own), 4096, ""},
		{uint64(4095 + own), 4096, "fewer than the 4096 buyers"},
		{524288, 16384, ""},
		{300, 4096, "it holds at most 74 buyers' connections"},
		{1024, -1, ""},
	} {
		got := fewFiles(c.limit, c.maxInFlight, own)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("fewFiles(%d, %d, %d) = %q, want %q", c.limit, c.maxInFlight, own, got, c.want)
		}
	}
}

// Buyers' connections are bounded at the limit less the process's own
// share whenever the limit is finite, not only below --max-in-flight: kept
// alive or refused, a connection holds a file past its request.
func TestConnectionCap(t *testing.T) {
	for _, c := range []struct {
		limit uint64
		own   int
		want  int
	}{
		{1024, 226, 798},
		{524288, 226, 524062},
		{227, 226, 1},
		{1<<24 - 1, 226, 1<<24 - 1 - 226},
		{1<<30 - 8, 226, 0}, // systemd's infinity
		{^uint64(0), 226, 0},
	} {
		if got, err := connectionCap(c.limit, c.own); got != c.want || err != nil {
			t.Errorf("connectionCap(%d, %d) = %d, %v; want %d", c.limit, c.own, got, err, c.want)
		}
	}
	// A limit that does not hold the process's own connections is refused.
	for _, limit := range []uint64{226, 100} {
		if got, err := connectionCap(limit, 226); err == nil || !strings.Contains(err.Error(), "raise the container runtime's RLIMIT_NOFILE") {
			t.Errorf("connectionCap(%d, 226) = %d, %v; want an error", limit, got, err)
		}
	}
}
