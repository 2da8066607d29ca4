package main

import (
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// What a script of reserve.lua's shape costs at the least, beside the
// product's body: where its in-command time goes, and what the layout a
// reviewer would try first (every reservation a field of one hash per shard,
// instead of a hash of its own) would save. Run in the same rounds
// as the other limits, with the same arguments, so the figures pair up.
const (
	limitEmpty  = "redis-benchmark EVALSHA of an empty script (reserve's arguments)"
	limitReads  = "redis-benchmark EVALSHA of 11 reads (reserve's command count, no writes)"
	limitPacked = "redis-benchmark EVALSHA reserve.lua, the record one field of a per-shard hash (not built)"
)

var (
	emptyScriptRef = redis.NewScript(`return 1`)
	readsScriptRef = redis.NewScript(strings.Repeat(`redis.call('HGET', KEYS[2], 'state') `, 11) + `return 1`)
)

// packedEdits turn the product's reserve body into the one-hash layout: the
// replay and fence read one hash's fields, and the record is one field, in
// one command (the hash is the shard's).
var packedEdits = []struct{ from, to string }{
	{`local prev = redis.call('HMGET', KEYS[4], 'e', 's', 'f:' .. tag)
if prev[3] then
  return {7, 0, epoch, 0, 'FENCED'}
end
if prev[1] then
  return {2, tonumber(prev[1]), epoch, -1, prev[2]}
end`, `local prev = redis.call('HMGET', KEYS[4], key, 'f:' .. key .. ':' .. tag)
if prev[2] then
  return {7, 0, epoch, 0, 'FENCED'}
end
if prev[1] then
  return {2, 0, epoch, -1, prev[1]}
end`},
	{`redis.call('HSET', KEYS[4], 'u', user, 'q', qty, 's', 'R', 'e', expiry, 'p', epoch, 'h', ARGV[9])
-- The hash may hold fences already (resolve.lua), with their lifetime.
redis.call('PERSIST', KEYS[4])`, `redis.call('HSET', KEYS[4], key, 'R|' .. qty .. '|' .. expiry .. '|' .. epoch .. '|' .. ARGV[9] .. '|' .. user)`},
}

// packedReserveScript is the product's reserve body (with this server's run
// id) in the one-hash layout; an error when the body no longer has the lines
// the edits replace, so the comparison follows reserve.lua or stops.
func packedReserveScript(body string) (*redis.Script, error) {
	for _, e := range packedEdits {
		if strings.Count(body, e.from) != 1 {
			return nil, fmt.Errorf("reserve.lua changed: the one-hash variant cannot replace %q", strings.SplitN(e.from, "\n", 2)[0])
		}
		body = strings.Replace(body, e.from, e.to, 1)
	}
	return redis.NewScript(body), nil
}

// floorRuns are the floor and layout runs of one shard's keys: the empty
// script and the reads take no unit (no counter to check); the one-hash
// reserve takes one unit a call from the shard's stock, as reserve does.
func floorRuns(k stock.Keys, reserveArgs []string, packed *redis.Script) []limitRun {
	with := func(s *redis.Script, res string) []string {
		args := append([]string{"EVALSHA", s.Hash()}, reserveArgs[2:]...)
		if res != "" {
			args[6] = res // KEYS[4]
		}
		return args
	}
	return []limitRun{
		{limitEmpty, "", with(emptyScriptRef, "")},
		{limitReads, "", with(readsScriptRef, "")},
		{limitPacked, k.Stock(), with(packed, k.Res("one-hash"))},
	}
}

// limitRun is one script run under redis-benchmark: counter is the key each
// call must decrement, or "" for a script that takes nothing.
type limitRun struct {
	name, counter string
	args          []string
}
