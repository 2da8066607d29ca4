package stock

import "github.com/redis/go-redis/v9"

// refusals are the error replies with which a Redis server refuses a
// command before running it: a redirect (MOVED, ASK), a slot being migrated
// (TRYAGAIN), a cluster or server not serving (CLUSTERDOWN, LOADING,
// MASTERDOWN), a script still running (BUSY), a script not loaded
// (NOSCRIPT). A script's own error ("ERR Error running script") is not one:
// it may stop after some of its writes.
var refusals = []string{"MOVED ", "ASK ", "TRYAGAIN ", "CLUSTERDOWN ", "LOADING ", "MASTERDOWN ", "BUSY ", "NOSCRIPT "}

// NotRun reports whether err is a server's refusal of a script call before
// it ran: the call did nothing, unlike a lost reply, after which it may have
// run or may still run.
func NotRun(err error) bool {
	for _, p := range refusals {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}
