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

// Package version holds the build's version, git commit and build date,
// stamped by the Makefile with -ldflags -X.
package version

import (
	"fmt"
	"runtime"
)

// Set with -ldflags "-X github.com/flashsale-dev/flashsale-operator/internal/version.Version=...".
var (
	// Version is the release version, e.g. v0.1.0, or a git describe.
	Version = "dev"
	// GitCommit is the full git commit the binary was built from.
	GitCommit = "unknown"
	// BuildDate is when the binary was built, RFC 3339 UTC.
	BuildDate = "unknown"
)

// String is the one-line description printed by `flashsale version`.
func String() string {
	return fmt.Sprintf("flashsale %s (commit %s, built %s, %s %s/%s)",
		Version, GitCommit, BuildDate, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
