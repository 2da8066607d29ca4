package main

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// redisServers is where the sales' shards live: one standalone server, or
// the masters of a Redis Cluster. The CPU and the command times reported are
// the sums over its processes.
type redisServers struct {
	Addrs   []string
	Cluster bool
	pids    []int
	close   func() error
}

func startRedis(cluster bool) (redisServers, error) {
	if !cluster {
		r, err := testharness.StartRedis()
		if err != nil {
			return redisServers{}, err
		}
		return redisServers{Addrs: []string{r.Addr()}, pids: []int{r.PID()}, close: r.Close}, nil
	}
	c, err := testharness.StartRedisCluster()
	if err != nil {
		return redisServers{}, err
	}
	rs := redisServers{Addrs: c.Addrs(), Cluster: true, close: c.Close}
	for _, n := range c.Nodes() {
		rs.pids = append(rs.pids, n.PID())
	}
	return rs, nil
}

// client is the client the engine is given: a cluster client for a
// Cluster, so that every shard's scripts go to the master of its slot.
func (rs redisServers) client() redis.UniversalClient {
	if rs.Cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: rs.Addrs})
	}
	return redis.NewClient(&redis.Options{Addr: rs.Addrs[0]})
}

// flush loses every server's data, as a Redis restarted empty does.
func (rs redisServers) flush(ctx context.Context) error {
	for _, addr := range rs.Addrs {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		err := rdb.FlushAll(ctx).Err()
		_ = rdb.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// cpuByServer is the CPU time of each server process so far.
func (rs redisServers) cpuByServer() []time.Duration {
	out := make([]time.Duration, len(rs.pids))
	for i, pid := range rs.pids {
		out[i] = cpustat.Process(pid)
	}
	return out
}

// commandStats reads every server's per-command microseconds (INFO
// commandstats; commands a script calls are counted under their own names
// too), summed.
func (rs redisServers) commandStats(ctx context.Context) map[string]float64 {
	out := map[string]float64{}
	for _, addr := range rs.Addrs {
		for k, v := range commandStats(ctx, addr) {
			out[k] += v
		}
	}
	return out
}

func commandStats(ctx context.Context, addr string) map[string]float64 {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	info, err := rdb.Info(ctx, "commandstats").Result()
	out := map[string]float64{}
	if err != nil {
		return out
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if k, v, _ := strings.Cut(kv, "="); k == "usec" {
				out[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return out
}
