package stock

import (
	"embed"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

func source(name string) string {
	src, err := scriptFiles.ReadFile("scripts/" + name + ".lua")
	if err != nil {
		panic(err) // embedded at build time: a missing file is a build mistake
	}
	return string(src)
}

func load(name string) script { return newScript(source(name)) }

// The scripts run by SHA (EVALSHA), falling back to EVAL on NOSCRIPT, which
// also reloads the script into the server's cache (after a restart, a failover or
// SCRIPT FLUSH); neither is ever re-sent (see script).
var (
	releaseScript        = load("release")
	cancelScript         = load("cancel")
	commitScript         = load("commit")
	payScript            = load("pay")
	quotaScript          = load("quota")
	resolveScript        = load("resolve")
	seedScript           = load("seed")
	gateScript           = load("gate")
	windowScript         = load("window")
	adjustScript         = load("adjust")
	withdrawScript       = load("withdraw")
	rebuildBeginScript   = load("rebuild_begin")
	rebuildRestoreScript = load("rebuild_restore")
	rebuildUsersScript   = load("rebuild_users")
	rebuildFinishScript  = load("rebuild_finish")
	stampScript          = load("stamp")
)

// reserveSource is reserve.lua; the body run on a server carries that server's
// run id in place of serverPlaceholder (see reserve.lua).
var reserveSource = source("reserve")

const serverPlaceholder = "'SERVER_RUN_ID'"

// reserveScripts caches the reserve script per server run id; reserveHashes
// holds their SHA1s.
var reserveScripts, reserveHashes sync.Map // run id -> *redis.Script; sha -> struct{}

// ReserveScriptFor is the reserve script as loaded on the server process with
// this run id.
func ReserveScriptFor(runID string) *redis.Script {
	if sc, ok := reserveScripts.Load(runID); ok {
		return sc.(*redis.Script)
	}
	body := redis.NewScript(strings.Replace(reserveSource, serverPlaceholder, strconv.Quote(runID), 1))
	reserveHashes.Store(body.Hash(), struct{}{})
	sc, _ := reserveScripts.LoadOrStore(runID, body)
	return sc.(*redis.Script)
}

// IsReserveScript reports whether sha is the SHA1 of a reserve script body
// (for metrics that tell the reserve script from the others).
func IsReserveScript(sha string) bool {
	_, ok := reserveHashes.Load(sha)
	return ok
}

// AddHook adds h where it sees every command a Store sends: on a standalone
// client, or on every node of a cluster (the reserve script goes straight to
// the node holding the shard, past the cluster client's own hooks). On a
// cluster client, call it before the first command.
func AddHook(rdb redis.UniversalClient, h redis.Hook) {
	if c, ok := rdb.(*redis.ClusterClient); ok {
		c.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
		return
	}
	rdb.AddHook(h)
}
