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

package version

import (
	"bytes"
	"strings"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/internal/version"
)

func TestVersionPrintsBuildInfo(t *testing.T) {
	version.Version, version.GitCommit, version.BuildDate = "v1.2.3", "abc123", "2026-11-29T09:00:00Z"
	var out bytes.Buffer
	cmd := NewCmd()
	cmd.SetOut(&out)
	cmd.SetArgs(nil)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"v1.2.3", "abc123", "2026-11-29T09:00:00Z"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output %q lacks %q", out.String(), want)
		}
	}
}
