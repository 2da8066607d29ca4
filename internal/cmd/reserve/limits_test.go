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

	"github.com/flashsale-dev/flashsale-operator/runtime/api"
)

// A process that cannot hold a socket for every buyer it takes in, and a
// few for its own connections, says so; one that can, or that takes in any
// number (-1), says nothing.
func TestFewFiles(t *testing.T) {
	for _, c := range []struct {
		limit       uint64
		maxInFlight int
		want        string // "" for none
	}{
		{1024, 4096, "this process may open 1024 files: fewer than the 4096 buyers"},
		{1024, 0, "fewer than the 16384 buyers"},
		{4096, 4096, "buyers past about 3840 connections wait to be accepted"},
		{4096 + spareFiles, 4096, ""},
		{524288, 0, ""},
		{1024, 768, ""},
		{1024, 769, "fewer than the 769 buyers"},
		{100, 4096, "buyers past about 0 connections"},
		{1024, -1, ""},
	} {
		got := fewFiles(c.limit, c.maxInFlight)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("fewFiles(%d, %d) = %q, want %q", c.limit, c.maxInFlight, got, c.want)
		}
	}
	if api.DefaultMaxInFlight != 16384 {
		t.Fatalf("DefaultMaxInFlight %d: the cases above assume 16384", api.DefaultMaxInFlight)
	}
}
