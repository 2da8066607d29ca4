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

// Package version is the `flashsale version` command.
package version

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/flashsale-dev/flashsale-operator/internal/version"
)

// NewCmd returns the `version` command.
func NewCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, git commit and build date",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.String())
			return err
		},
	}
}
