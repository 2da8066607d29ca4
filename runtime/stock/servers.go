package stock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrRedisTooOld: a server runs a Redis older than 7.0. Older servers copy
// SCRIPT LOAD to their replicas and their AOF, so a promoted replica, or a
// server restarted from its AOF, would hold a reserve script body loaded for
// another process and accept its possibly older data (see reserve.lua).
var ErrRedisTooOld = errors.New("the shards need Redis 7.0 or later")

// runID reads node's run id, and refuses a server older than 7.0.
func runID(ctx context.Context, node *redis.Client) (string, error) {
	info, err := node.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	return runIDFrom(node.Options().Addr, info)
}

// serverInfo reads node's INFO server and section in one round trip, and its
// run id from it; it refuses a server older than 7.0.
func serverInfo(ctx context.Context, node *redis.Client, section string) (info, id string, err error) {
	info, err = node.Info(ctx, "server", section).Result()
	if err != nil {
		// A server before 7.0 refuses two sections: INFO server alone
		// names it (ErrRedisTooOld).
		if _, verr := runID(ctx, node); verr != nil {
			return "", "", verr
		}
		return "", "", err
	}
	id, err = runIDFrom(node.Options().Addr, info)
	return info, id, err
}

// runIDFrom is the run id in an INFO answer that has its server section.
func runIDFrom(addr, info string) (string, error) {
	if err := checkVersion(addr, infoField(info, "redis_version")); err != nil {
		return "", err
	}
	id := infoField(info, "run_id")
	if id == "" {
		return "", fmt.Errorf("%s: INFO server has no run_id", addr)
	}
	return id, nil
}

// Stamp records the run id and master_replid of the server holding each shard
// in the metas that lack them (shards seeded before metas recorded them), so
// that the reserve script can tell from then on when their data comes from
// another server process or replication history. Call it only after checking
// that the servers did not restart. It returns how many shards it stamped.
func (s *Store) Stamp(ctx context.Context) (int, error) {
	pipe := s.rdb.Pipeline()
	has := make([]*redis.SliceCmd, len(s.shards))
	for i, k := range s.shards {
		has[i] = pipe.HMGet(ctx, k.Meta(), "srv", "lin")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	stamped := 0
	for i, k := range s.shards {
		if v := has[i].Val(); len(v) == 2 && v[0] != nil && v[1] != nil {
			continue
		}
		n, err := stampScript.Run(ctx, s.rdb, []string{k.Meta()}).Int()
		if err != nil {
			return stamped, fmt.Errorf("stamp shard %d: %w", i, err)
		}
		stamped += n
	}
	return stamped, nil
}

// verifyServers sets Unverified on the states whose meta records another
// server process than the one holding the shard now, or another replication
// history of it. Each server is read once, now: the reserve path's cached ids
// would miss a restart that no reserve call has run into yet.
func (s *Store) verifyServers(ctx context.Context, states []ShardState) error {
	now := map[string]serverID{} // by address
	for i := range states {
		st := &states[i]
		if st.Server == "" {
			continue
		}
		node, err := s.node(ctx, s.shards[st.Index].Meta())
		if err != nil {
			return err
		}
		addr := node.Options().Addr
		id, ok := now[addr]
		if !ok {
			if id, err = identify(ctx, node); err != nil {
				return err
			}
			now[addr] = id
		}
		st.Unverified = st.Server != id.run || (st.Lineage != "" && st.Lineage != id.lineage && id.promoted)
	}
	return nil
}

// serverID names a server process (run id) and the replication history its
// data comes from (master_replid). A promotion starts a new history and keeps
// the one before (master_replid2); a master starting a backlog for its first
// replica starts one too, with none before it (see reserve.lua).
type serverID struct {
	run, lineage string
	promoted     bool // master_replid2 is set
}

// identify reads node's run id and master_replid, and refuses a server older
// than 7.0.
func identify(ctx context.Context, node *redis.Client) (serverID, error) {
	info, run, err := serverInfo(ctx, node, "replication")
	if err != nil {
		return serverID{}, err
	}
	lineage := infoField(info, "master_replid")
	if lineage == "" {
		return serverID{}, fmt.Errorf("%s: INFO replication has no master_replid", node.Options().Addr)
	}
	prev := infoField(info, "master_replid2")
	return serverID{run: run, lineage: lineage, promoted: strings.Trim(prev, "0") != ""}, nil
}

// shardServers returns the servers holding the campaign's shards, each once: in a
// cluster, the masters of their slots by the client's slot map.
func (s *Store) shardServers(ctx context.Context) ([]*redis.Client, error) {
	held, err := s.shardsByServer(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*redis.Client, 0, len(held))
	for _, h := range held {
		out = append(out, h.node)
	}
	return out, nil
}

// serverShards is one server holding shards of the campaign, and which.
type serverShards struct {
	node   *redis.Client
	shards []int
}

// shardsByServer groups the campaign's shards by the server holding them,
// in the order of their first shard.
func (s *Store) shardsByServer(ctx context.Context) ([]serverShards, error) {
	var out []serverShards
	at := map[string]int{}
	for i, k := range s.shards {
		node, err := s.node(ctx, k.Meta())
		if err != nil {
			return nil, err
		}
		addr := node.Options().Addr
		j, ok := at[addr]
		if !ok {
			j, at[addr] = len(out), len(out)
			out = append(out, serverShards{node: node})
		}
		out[j].shards = append(out[j].shards, i)
	}
	return out, nil
}

// Ping checks that every server holding the campaign's shards answers. A
// keyless PING through a cluster client goes to a master of its slot map,
// which a reload during a whole-cluster restart can leave empty until its next
// refresh, and then fails; going by key, an empty map sends each ping to a
// known node instead, and the first command that meets a moved slot reloads
// the map.
func (s *Store) Ping(ctx context.Context) error {
	nodes, err := s.shardServers(ctx)
	if err != nil {
		return err
	}
	for _, node := range nodes {
		if err := node.Ping(ctx).Err(); err != nil {
			s.redirected(ctx, err)
			return fmt.Errorf("%s: %w", node.Options().Addr, err)
		}
	}
	return nil
}

// RunIDs returns the run_id of every Redis server holding shards of the
// campaign, keyed by address: in a cluster, the masters that own the slots of
// the shards, not every master, so that a restart or a new master elsewhere in
// a shared cluster does not read as this sale's data loss. A changed run_id
// means the server restarted and may have lost its data; a shard whose slot
// moves to another server shows up as a new address.
func (s *Store) RunIDs(ctx context.Context) (map[string]string, error) {
	srv, err := s.Servers(ctx)
	return srv.RunIDs, err
}

// ServerCheck is what one INFO of each server holding shards says.
type ServerCheck struct {
	RunIDs map[string]string // by address
	// Evicting is ErrEvictionPolicy naming the servers that may evict keys,
	// or nil.
	Evicting error
}

// Servers reads the servers holding the sale's shards, one INFO (server and
// memory) each: RunIDs and CheckEviction in one round trip per server, for a
// caller that needs both at every refresh.
func (s *Store) Servers(ctx context.Context) (ServerCheck, error) {
	if c, ok := s.rdb.(*redis.ClusterClient); ok {
		// ForEachMaster reloads the slot map first (MasterForKey alone uses
		// the cached one): a failover must show as the new master at once.
		if err := c.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }); err != nil {
			return ServerCheck{}, err
		}
	}
	nodes, err := s.shardServers(ctx)
	if err != nil {
		return ServerCheck{}, err
	}
	out := ServerCheck{RunIDs: make(map[string]string, len(nodes))}
	var evicting []string
	for _, node := range nodes {
		addr := node.Options().Addr
		info, id, err := serverInfo(ctx, node, "memory")
		if err != nil {
			return out, err
		}
		out.RunIDs[addr] = id
		policy, max := infoField(info, "maxmemory_policy"), infoField(info, "maxmemory")
		switch {
		case policy == "" || max == "":
			evicting = append(evicting, fmt.Sprintf("%s (INFO memory does not say its maxmemory and maxmemory-policy)", addr))
		case policy != "noeviction" && max != "0":
			evicting = append(evicting, fmt.Sprintf("%s (maxmemory %s, maxmemory-policy %s)", addr, max, policy))
		}
	}
	if len(evicting) > 0 {
		slices.Sort(evicting)
		out.Evicting = fmt.Errorf("%w: %s", ErrEvictionPolicy, strings.Join(evicting, ", "))
	}
	return out, nil
}

// ErrEvictionPolicy: a server holding shards may evict keys under memory
// pressure (maxmemory set, maxmemory-policy other than noeviction). An evicted
// reservation hash loses its unit, an evicted users hash lifts the per-user
// limit, an evicted stock key shows a shard sold out.
var ErrEvictionPolicy = errors.New("a Redis server holding shards may evict keys: set maxmemory-policy noeviction (or no maxmemory)")

// CheckEviction refuses servers holding shards that may evict keys
// (ErrEvictionPolicy, naming them and their policy).
func (s *Store) CheckEviction(ctx context.Context) error {
	srv, err := s.Servers(ctx)
	if err != nil {
		return err
	}
	return srv.Evicting
}

func checkVersion(addr, version string) error {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	switch {
	case err != nil:
		return fmt.Errorf("%s: INFO server gives no redis_version (%q)", addr, version)
	case n < 7:
		return fmt.Errorf("%w: %s runs %s", ErrRedisTooOld, addr, version)
	}
	return nil
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
