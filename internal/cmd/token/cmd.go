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

// Package token is the `flashsale token` command: it mints an admission token,
// as a waiting room would, with the key shared with the reserve pods.
package token

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// Options are the settings of `flashsale token`.
type Options struct {
	SKU     string
	User    string
	TTL     time.Duration
	KeyFile string
}

// NewCmd returns the `token` command.
func NewCmd() *cobra.Command {
	var opts Options
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Print an admission token for a user on a SKU (what a waiting room issues)",
		Long: `Prints an admission token: v1.<base64url(payload)>.<base64url(HMAC-SHA256)>,
bound to --sku, --user and an expiry --ttl from now (see docs/api.md).
The key comes from --key-file, else from ` + config.EnvAdmissionKey + ` or ` + config.EnvAdmissionKey + config.FileSuffix + `.`,
		Example:      `  flashsale token --sku itm-ps5-pro --user u-123 --ttl 10m --key-file ./hmac-key`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.SKU == "" {
				return errors.New("--sku (or " + config.EnvSKU + ") is required")
			}
			key, err := loadKey(opts.KeyFile)
			if err != nil {
				return err
			}
			tok, err := admission.Mint(key, opts.SKU, opts.User, opts.TTL, time.Now())
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), tok)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.SKU, "sku", os.Getenv(config.EnvSKU), "the SKU the token admits to (env "+config.EnvSKU+")")
	f.StringVar(&opts.User, "user", "", "the user the token is for")
	f.DurationVar(&opts.TTL, "ttl", 10*time.Minute, "how long the token is valid")
	f.StringVar(&opts.KeyFile, "key-file", "", "file holding the admission key (default: env "+config.EnvAdmissionKey+" or "+config.EnvAdmissionKey+config.FileSuffix+")")
	_ = cmd.MarkFlagRequired("user")
	return cmd
}

// loadKey reads the key from file, else from the environment like the reserve pods.
func loadKey(file string) ([]byte, error) {
	var key string
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--key-file: %w", err)
		}
		// Same trimming as config.Secret, so both read a Secret file alike.
		key = strings.TrimRight(string(b), "\r\n")
	} else {
		var err error
		if key, err = config.Secret(config.EnvAdmissionKey); err != nil {
			return nil, err
		}
		if key == "" {
			return nil, errors.New("no admission key: give --key-file, or set " + config.EnvAdmissionKey + " or " + config.EnvAdmissionKey + config.FileSuffix)
		}
	}
	if len(key) < admission.MinKeyLen {
		return nil, admission.ErrKey
	}
	return []byte(key), nil
}
