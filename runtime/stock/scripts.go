package stock

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

func load(name string) *redis.Script {
	src, err := scriptFiles.ReadFile("scripts/" + name + ".lua")
	if err != nil {
		panic(err) // embedded at build time: a missing file is a build mistake
	}
	return redis.NewScript(string(src))
}

// The scripts run by SHA (EVALSHA); go-redis falls back to EVAL on NOSCRIPT, which
// also reloads the script into the server's cache (after a restart, a failover or
// SCRIPT FLUSH).
var (
	reserveScript        = load("reserve")
	releaseScript        = load("release")
	cancelScript         = load("cancel")
	commitScript         = load("commit")
	quotaScript          = load("quota")
	seedScript           = load("seed")
	gateScript           = load("gate")
	adjustScript         = load("adjust")
	withdrawScript       = load("withdraw")
	rebuildBeginScript   = load("rebuild_begin")
	rebuildRestoreScript = load("rebuild_restore")
	rebuildUsersScript   = load("rebuild_users")
	rebuildFinishScript  = load("rebuild_finish")
)

// ReserveScript is the raw reserve script, for benchmarks that measure the ceiling.
func ReserveScript() *redis.Script { return reserveScript }
