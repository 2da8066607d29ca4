package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// storm runs `flashsale storm` against the Service, configured from the
// FlashSale and its Secrets, and streams its output.
func storm(ctx context.Context, p *out, env *localenv.Env, bin, dir, url string, buyers int) error {
	get := func(path string) (string, error) {
		return env.Kubectl(ctx, nil, "get", "flashsale", saleName, "-n", namespace, "-o", "jsonpath="+path)
	}
	uid, err := get("{.metadata.uid}")
	if err != nil {
		return err
	}
	sku, err := get("{.spec.sku}")
	if err != nil {
		return err
	}
	redisAddr, err := secretValue(ctx, env, "shop-redis", "addresses")
	if err != nil {
		return err
	}
	dsn, err := secretValue(ctx, env, "shop-ledger", "dsn")
	if err != nil {
		return err
	}
	key, err := secretValue(ctx, env, "waiting-room", "hmac-key")
	if err != nil {
		return err
	}
	keyFile := filepath.Join(dir, "hmac-key")
	if err := os.WriteFile(keyFile, []byte(key), 0o600); err != nil {
		return err
	}
	args := []string{"storm", "--url", url, "--buyers", strconv.Itoa(buyers), "--sku", sku,
		"--campaign-id", uid, "--redis-addresses", redisAddr, "--key-file", keyFile}
	// The command as a person would type it.
	shown := append([]string{"bin/flashsale"}, args...)
	if env.Cluster != nil {
		shown = append([]string{"ip", "netns", "exec", filepath.Base(env.Cluster.Netns), rel(bin)}, args...)
		fmt.Fprintf(p.w, "  # the reserve Service %s/%s-reserve at its ClusterIP %s, through kube-proxy, from inside the node's namespace\n", namespace, saleName, url)
	} else {
		fmt.Fprintf(p.w, "  # the reserve Service %s/%s-reserve is exposed by the pod runner at %s\n", namespace, saleName, url)
	}
	fmt.Fprintf(p.w, "  # half the buyers who get a unit pay, a tenth cancel, the rest walk away\n")
	fmt.Fprintf(p.w, "  $ export %s=\"$(kubectl get secret shop-ledger -n %s -o jsonpath={.data.dsn} | base64 -d)\"\n", config.EnvPostgresDSN, namespace)
	p.command(shown...)
	sctx, cancel := context.WithTimeout(ctx, stormTimeout)
	defer cancel()
	cmd := env.Command(sctx, bin, args...)
	cmd.Env = append(os.Environ(), config.EnvPostgresDSN+"="+dsn)
	cmd.Stdout, cmd.Stderr = indent(p.w), indent(os.Stderr)
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("flashsale storm: %w", err)
	}
	p.done("storm finished and its audit passed", time.Since(start))
	return nil
}

// waitStatusSettled waits until the FlashSale's status adds up and stops
// changing (the controller refreshes it every second or so).
func waitStatusSettled(ctx context.Context, env *localenv.Env) error {
	deadline := time.Now().Add(statusTimeout)
	prev := ""
	for {
		s, err := env.Kubectl(ctx, nil, "get", "flashsale", saleName, "-n", namespace, "-o",
			"jsonpath={.status.allocation} {.status.available} {.status.reserved} {.status.sold}")
		if err != nil {
			return err
		}
		var alloc, avail, res, sold int64
		_, _ = fmt.Sscan(s, &alloc, &avail, &res, &sold)
		if s == prev && alloc > 0 && avail+res+sold == alloc {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the FlashSale status did not settle within %v (last: %s)", statusTimeout, s)
		}
		prev = s
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(1500 * time.Millisecond):
		}
	}
}
