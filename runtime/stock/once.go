package stock

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// script is a Lua script whose calls a client library never re-sends.
//
// go-redis re-sends a command after a timeout or a lost connection: a plain
// client up to MaxRetries times, a cluster client within its redirect loop
// (MaxRedirects) whatever its MaxRetries. A script whose reply was lost may
// have run, and running some of them again is not running them once (a quota
// claim answers its own second run BUSY; a restore counts its units twice). So
// every script goes as a command that says NoRetry, which both loops honour
// (and a sentinel failover client, a plain client underneath), and the
// caller that gets an error resolves the doubt by looking. A cluster
// client still follows MOVED and ASK for it (that loop checks redirects
// before retries): a redirect means the command did not run. The reserve
// script is the exception: it goes on its master's own client
// (Store.runReserve), which follows nothing, and a redirect or another
// refusal before it ran comes back to the engine as such (NotRun).
type script struct {
	src  string
	sha1 string
}

func newScript(src string) script { return script{src: src, sha1: redis.NewScript(src).Hash()} }

// processor is a client, a cluster client or a cluster node's client.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// Run is redis.Script.Run sent once: EVALSHA, then EVAL when the server
// answers NOSCRIPT. That fallback is no re-send: NOSCRIPT is answered before
// any of the script runs, so the EVAL is its first run.
func (s script) Run(ctx context.Context, c processor, keys []string, args ...any) *redis.Cmd {
	return s.runArgs(ctx, c, len(keys), buildEvalArgs(keys, args))
}

// evalShaOnce is EVALSHA sent once, with no EVAL fallback (the reserve script:
// its body is loaded per server process, see runReserve).
func evalShaOnce(ctx context.Context, c processor, sha1 string, keys []string, args ...any) *redis.Cmd {
	return evalOnce(ctx, c, "evalsha", sha1, keys, args)
}

func evalOnce(ctx context.Context, c processor, name, payload string, keys []string, args []any) *redis.Cmd {
	cmd := evalCmd(ctx, name, payload, keys, args)
	_ = c.Process(ctx, noRetryCmd{cmd})
	return cmd
}

// evalCmd is an EVAL or EVALSHA command, not sent.
func evalCmd(ctx context.Context, name, payload string, keys []string, args []any) *redis.Cmd {
	return evalArgsCmd(ctx, name, payload, len(keys), buildEvalArgs(keys, args))
}

// buildEvalArgs is a call's keys and arguments in one newEvalArgs slice.
func buildEvalArgs(keys []string, args []any) evalArgs {
	cmdArgs := newEvalArgs(len(keys), len(args))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	return append(cmdArgs, args...)
}

// evalArgs is a script call built in place: newEvalArgs's slice, with the
// call's keys and then its arguments appended. A rebuild's calls carry
// thousands of arguments, and building them in the command's own slice
// spares a copy of each.
type evalArgs []any

// newEvalArgs leaves room for the command, the script and the key count.
func newEvalArgs(keys, args int) evalArgs { return make(evalArgs, 3, 3+keys+args) }

// evalArgsCmd is the EVAL or EVALSHA command of cmdArgs, not sent.
func evalArgsCmd(ctx context.Context, name, payload string, keys int, cmdArgs evalArgs) *redis.Cmd {
	cmdArgs[0], cmdArgs[1], cmdArgs[2] = name, payload, keys
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if keys > 0 {
		cmd.SetFirstKeyPos(3) // the cluster client routes by the first key
	}
	return cmd
}

// runArgs is Run of a call built with newEvalArgs (keys of them): EVALSHA,
// then EVAL on NOSCRIPT.
func (s script) runArgs(ctx context.Context, c processor, keys int, cmdArgs evalArgs) *redis.Cmd {
	cmd := evalArgsCmd(ctx, "evalsha", s.sha1, keys, cmdArgs)
	_ = c.Process(ctx, noRetryCmd{cmd})
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = evalArgsCmd(ctx, "eval", s.src, keys, cmdArgs)
		_ = c.Process(ctx, noRetryCmd{cmd})
	}
	return cmd
}

// noRetryCmd is a command go-redis does not send a second time once it may
// have reached the server (a timeout, a reset, EOF). A failure before it was
// written (no connection from the pool, a dial error) is still tried again:
// that is its first run.
type noRetryCmd struct{ *redis.Cmd }

func (noRetryCmd) NoRetry() bool { return true }
