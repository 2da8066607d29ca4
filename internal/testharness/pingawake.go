package testharness

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// PingAwake pings until an answer comes within probe's read timeout. A fault
// test's probe has a short one, to tell a server asleep (DEBUG SLEEP) from
// one that answers; on a loaded machine a first answer may take longer, and
// the server is not asleep yet.
func PingAwake(ctx context.Context, probe *redis.Client) error {
	var err error
	for range 100 {
		err = probe.Ping(ctx).Err()
		var ne interface{ Timeout() bool }
		if err == nil || !errors.As(err, &ne) || !ne.Timeout() || ctx.Err() != nil {
			return err
		}
	}
	return fmt.Errorf("the server did not answer a ping in time, 100 times: %w", err)
}
