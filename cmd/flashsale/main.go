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

// Command flashsale is the one binary of flashsale-operator. Each role is a
// subcommand defined in its own package under internal/cmd.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/flashsale-dev/flashsale-operator/internal/cmd/manager"
	"github.com/flashsale-dev/flashsale-operator/internal/cmd/reserve"
	"github.com/flashsale-dev/flashsale-operator/internal/cmd/storm"
	"github.com/flashsale-dev/flashsale-operator/internal/cmd/sweeper"
	"github.com/flashsale-dev/flashsale-operator/internal/cmd/token"
	"github.com/flashsale-dev/flashsale-operator/internal/cmd/version"
)

func main() {
	root := &cobra.Command{
		Use:           "flashsale",
		Short:         "Run flash-sale campaigns on Kubernetes: Redis stock shards, PostgreSQL ledger",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.AddCommand(
		manager.NewCmd(),
		reserve.NewCmd(),
		sweeper.NewCmd(),
		storm.NewCmd(),
		token.NewCmd(),
		version.NewCmd(),
	)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}
