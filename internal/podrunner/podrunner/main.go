// Command podrunner is the local pod runner as a binary of its own, for
// `make demo DEMO_FLAGS=--node=false` and the end-to-end suite in test/e2e: it is not
// part of the flashsale binary, so it never ships in the operator's image.
// Real pods run on the test node (internal/testharness.Cluster); the runner
// remains where no root is available to run one.
//
//	go build -o podrunner ./internal/podrunner/podrunner
//	podrunner --kubeconfig ... --binary bin/flashsale ...
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/flashsale-dev/flashsale-operator/internal/cmd/podrunner"
)

func main() {
	cmd := podrunner.NewCmd()
	cmd.SilenceUsage = true
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}
