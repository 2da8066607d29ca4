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

package reserve

import (
	"fmt"
	"log/slog"
	"syscall"

	"github.com/flashsale-dev/flashsale-operator/runtime/api"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// ownFiles are the files a reserve process may keep open besides its
// buyers' connections: go-redis's pool to each Redis server (a standalone
// client's one; a cluster's, one per address given, which names its masters
// or fewer of them), the ledger's pool (32 unless the DSN sets
// pool_max_conns) and its writers' connections, and 64 for the listeners,
// the probes, the scrapes and the files it reads.
func ownFiles(redisServers, ledgerPool, ledgerWriters int) int {
	return config.RedisPoolSize*max(redisServers, 1) + ledgerPool + ledgerWriters + 64
}

// fewFiles says why a process allowed to open limit files cannot hold the
// connections of the maxInFlight buyers it takes in at once (-1: no bound,
// nothing to compare) beside its own, or "" when it can.
func fewFiles(limit uint64, maxInFlight, own int) string {
	if maxInFlight < 0 || limit >= uint64(maxInFlight+own) {
		return ""
	}
	return fmt.Sprintf("this process may open %d files: fewer than the %d buyers --max-in-flight takes in at once and the %d its own connections may take; "+
		"it holds at most %d buyers' connections, closing each after its answer while at that bound, and the next wait in the kernel's listen queue, unseen by the line and its 503s (raise the container runtime's RLIMIT_NOFILE, or lower maxInFlight)",
		limit, maxInFlight, own, int64(limit)-int64(own))
}

// unboundedFiles is an open-file limit too large to matter: no bound then
// (systemd's infinity is 2^30 - 8 files).
const unboundedFiles = 1 << 24

// connectionCap is the most buyers' connections a process allowed to open
// limit files holds, keeping own for its connections to Redis and the
// ledger and for its metrics listener: past the limit it could open none of
// them, and the kubelet's probes would fail with them. 0: no bound. A limit
// that does not even hold own is an error: such a process could serve
// hardly anyone.
func connectionCap(limit uint64, own int) (int, error) {
	switch {
	case limit >= unboundedFiles:
		return 0, nil
	case limit <= uint64(own):
		return 0, fmt.Errorf("this process may open %d files, no more than the %d its own connections to Redis and the ledger may take: raise the container runtime's RLIMIT_NOFILE", limit, own)
	}
	return int(limit) - own, nil
}

// maxConnections is the bound on buyers' connections for this process's
// open-file limit (the Go runtime has raised its soft limit to the hard one
// at start); 0: none. The bound holds whatever --max-in-flight says, since
// connections outlive their requests (kept alive, refused, waiting for their
// headers); it is logged as a warning when it is below --max-in-flight.
func maxConnections(log *slog.Logger, maxInFlight, own int, probesAside bool) (int, error) {
	if maxInFlight == 0 {
		maxInFlight = api.DefaultMaxInFlight
	}
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		log.Warn("cannot read the open-file limit", "err", err)
		return 0, nil
	}
	n, err := connectionCap(r.Cur, own)
	if err != nil {
		return 0, err
	}
	log.Info("buyers' connections bounded by the open-file limit", "files", r.Cur, "ownFiles", own, "maxConnections", n)
	if why := fewFiles(r.Cur, maxInFlight, own); why != "" {
		if !probesAside {
			why += "; without --metrics-listen the probes wait in that queue too"
		}
		log.Warn("open-file limit below max in flight", "why", why, "files", r.Cur, "maxInFlight", maxInFlight, "ownFiles", own, "maxConnections", n)
	}
	return n, nil
}
