// Command golangci-kal is golangci-lint with the Kubernetes API linter
// (kube-api-linter) registered as the module plugin "kubeapilinter".
//
// It is the binary `golangci-lint custom` would produce, built instead from
// the module versions pinned in this directory's go.mod, so it needs nothing
// but the Go module proxy (hack/build-tool.sh golangci-lint builds and caches
// it).
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/golangci/golangci-lint/v2/pkg/commands"
	"github.com/golangci/golangci-lint/v2/pkg/exitcodes"

	// Registers the kubeapilinter module plugin with golangci-lint.
	_ "sigs.k8s.io/kube-api-linter"
)

const (
	golangciModule = "github.com/golangci/golangci-lint/v2"
	kalModule      = "sigs.k8s.io/kube-api-linter"
)

func main() {
	if err := commands.Execute(buildInfo()); err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "golangci-lint: %v\n", err)
		os.Exit(exitcodes.Failure)
	}
}

// buildInfo reports the golangci-lint and kube-api-linter versions linked
// in, which is what `golangci-lint version` should say of this binary.
func buildInfo() commands.BuildInfo {
	info := commands.BuildInfo{Version: "unknown", Commit: "?", Date: "(unknown)", GoVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	info.GoVersion = bi.GoVersion
	versions := map[string]string{}
	for _, dep := range bi.Deps {
		versions[dep.Path] = dep.Version
	}
	info.Version = fmt.Sprintf("%s with kube-api-linter %s",
		strings.TrimPrefix(versions[golangciModule], "v"), versions[kalModule])
	return info
}
