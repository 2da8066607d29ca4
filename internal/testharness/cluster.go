package testharness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterMasters is the number of masters of a cluster.
const clusterMasters = 3

// RedisCluster is a Redis Cluster of three masters on 127.0.0.1, with or
// without one replica each.
type RedisCluster struct {
	mu       sync.Mutex
	cli      string
	nodes    []*Redis
	replicas int // per master
	closed   bool
}

// StartRedisCluster starts three cluster-enabled redis-server processes,
// joins them with `redis-cli --cluster create` and waits until every node
// reports cluster_state:ok with all 16384 slots covered.
func StartRedisCluster() (*RedisCluster, error) { return startRedisCluster(0) }

// StartRedisClusterWithReplicas is StartRedisCluster with one replica per
// master (six processes), for failovers (Failover).
func StartRedisClusterWithReplicas() (*RedisCluster, error) { return startRedisCluster(1) }

func startRedisCluster(replicas int) (*RedisCluster, error) {
	cli, err := lookBinary("redis-cli", "redis-tools")
	if err != nil {
		return nil, err
	}
	c := &RedisCluster{cli: cli, replicas: replicas}
	// Replicas sync at once instead of waiting for more replicas to batch.
	extra := []string{"--repl-diskless-sync-delay", "0"}
	for range clusterMasters * (1 + replicas) {
		n, err := newRedis(true, extra)
		if err != nil {
			_ = c.closeNodes()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	if err := c.create(); err != nil {
		_ = c.closeNodes()
		return nil, err
	}
	register(c)
	return c, nil
}

// RedisClusterT starts a Redis Cluster for a test and closes it in t.Cleanup.
func RedisClusterT(t testing.TB) *RedisCluster {
	t.Helper()
	c, err := StartRedisCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// RedisClusterWithReplicasT is RedisClusterT with one replica per master.
func RedisClusterWithReplicasT(t testing.TB) *RedisCluster {
	t.Helper()
	c, err := StartRedisClusterWithReplicas()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Failover promotes a replica of the master serving slot (CLUSTER FAILOVER
// on the replica: it catches up with its master first) and waits until every
// node agrees. It returns the promoted node.
func (c *RedisCluster) Failover(slot int) (*Redis, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	master, err := c.masterOf(slot)
	if err != nil {
		return nil, err
	}
	var replica *Redis
	for _, n := range c.nodes {
		info, err := redisCmd(n.Addr(), "INFO", "replication")
		if err == nil && strings.Contains(info, "role:slave\r\n") &&
			strings.Contains(info, fmt.Sprintf("master_port:%d\r\n", master.port)) {
			replica = n
			break
		}
	}
	if replica == nil {
		return nil, fmt.Errorf("redis cluster: no replica of %s (started without replicas?)", master.Addr())
	}
	// A manual failover gives up after 5 s if the replica has not caught up,
	// so wait for its first sync to be done; ask again while it is not promoted.
	deadline := time.Now().Add(readyTimeout)
	for {
		info, err := redisCmd(replica.Addr(), "INFO", "replication")
		if err == nil && strings.Contains(info, "master_link_status:up\r\n") && strings.Contains(info, "master_sync_in_progress:0\r\n") {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("redis cluster: replica %s not in sync after %v:\n%s", replica.Addr(), readyTimeout, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	asked := time.Time{}
	for {
		if m, err := c.masterOf(slot); err == nil && m == replica {
			break
		}
		if time.Since(asked) > 6*time.Second {
			if _, err := redisCmd(replica.Addr(), "CLUSTER", "FAILOVER"); err != nil {
				return nil, err
			}
			asked = time.Now()
		}
		if time.Now().After(deadline) {
			nodes, _ := redisCmd(replica.Addr(), "CLUSTER", "NODES")
			repl, _ := redisCmd(replica.Addr(), "INFO", "replication")
			return nil, fmt.Errorf("redis cluster: %s not promoted after %v; it sees:\n%s\n%s\n%s", replica.Addr(), readyTimeout, nodes, repl, logTail(replica.logPath))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return replica, c.waitOK()
}

// MoveSlot moves slot, with its keys, from the master serving it to the
// master to, the way a resharding does: IMPORTING on the target, MIGRATING on
// the source, MIGRATE of the keys, then SETSLOT NODE on every master. It waits
// until every node names to as the slot's master.
func (c *RedisCluster) MoveSlot(slot int, to *Redis) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	from, err := c.masterOf(slot)
	if err != nil {
		return err
	}
	if from == to {
		return fmt.Errorf("redis cluster: %s already serves slot %d", to.Addr(), slot)
	}
	fromID, err := redisCmd(from.Addr(), "CLUSTER", "MYID")
	if err != nil {
		return err
	}
	toID, err := redisCmd(to.Addr(), "CLUSTER", "MYID")
	if err != nil {
		return err
	}
	n := strconv.Itoa(slot)
	if _, err := redisCmd(to.Addr(), "CLUSTER", "SETSLOT", n, "IMPORTING", fromID); err != nil {
		return err
	}
	if _, err := redisCmd(from.Addr(), "CLUSTER", "SETSLOT", n, "MIGRATING", toID); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	src := redis.NewClient(&redis.Options{Addr: from.Addr()})
	defer src.Close()
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("redis cluster: migrate slot %d: %w", slot, err)
		}
	}
	for _, m := range []*Redis{to, from} {
		if _, err := redisCmd(m.Addr(), "CLUSTER", "SETSLOT", n, "NODE", toID); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		if m, err := c.masterOf(slot); err == nil && m == to {
			return c.waitOK()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis cluster: nodes do not all name %s as the master of slot %d after %v", to.Addr(), slot, readyTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// slotMasterPort is the port of the master serving slot, as the node at addr
// sees it (CLUSTER NODES: "<id> <ip:port@bus> <flags> ... <slot ranges>").
func slotMasterPort(addr string, slot int) (int, error) {
	out, err := redisCmd(addr, "CLUSTER", "NODES")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, found := strings.Cut(r, "-")
			if !found {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || slot < a || slot > b {
				continue
			}
			hostPort, _, _ := strings.Cut(f[1], "@")
			_, portText, _ := strings.Cut(hostPort, ":")
			return strconv.Atoi(portText)
		}
	}
	return 0, fmt.Errorf("redis cluster: %s names no master for slot %d", addr, slot)
}

// masterOf is the node every node names as serving slot.
func (c *RedisCluster) masterOf(slot int) (*Redis, error) {
	var master *Redis
	for _, n := range c.nodes {
		port, err := slotMasterPort(n.Addr(), slot)
		if err != nil {
			return nil, err
		}
		var m *Redis
		for _, x := range c.nodes {
			if x.port == port {
				m = x
			}
		}
		if m == nil || master != nil && m != master {
			return nil, fmt.Errorf("redis cluster: nodes disagree on the master of slot %d", slot)
		}
		master = m
	}
	return master, nil
}

// Addrs returns the "127.0.0.1:PORT" address of every node.
func (c *RedisCluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the nodes, e.g. to Kill one of them. Restarting a single node
// with Start keeps its nodes.conf, so it rejoins the cluster.
func (c *RedisCluster) Nodes() []*Redis { return c.nodes }

// RestartEmpty kills every node, wipes its data and nodes.conf, starts it on
// the same ports and creates the cluster again: a cluster that lost all data.
func (c *RedisCluster) RestartEmpty() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("redis cluster: closed")
	}
	for _, n := range c.nodes {
		if err := n.RestartEmpty(); err != nil {
			return err
		}
	}
	return c.create()
}

// Close kills every node and removes their directories. It is idempotent.
func (c *RedisCluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	unregister(c)
	return c.closeNodes()
}

func (c *RedisCluster) closeNodes() error {
	errs := make([]error, 0, len(c.nodes))
	for _, n := range c.nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}

func (c *RedisCluster) create() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*readyTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	cmd := exec.CommandContext(ctx, c.cli, append(args, "--cluster-replicas", strconv.Itoa(c.replicas), "--cluster-yes")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(filepath.Join(c.nodes[0].dir, "cluster-create.log"), out, 0o644)
	if err != nil {
		return fmt.Errorf("redis-cli --cluster create %s: %v\n%s", strings.Join(c.Addrs(), " "), err, out)
	}
	return c.waitOK()
}

// waitOK waits until every node sees all nodes and all slots served.
func (c *RedisCluster) waitOK() error {
	want := []string{
		"cluster_state:ok",
		"cluster_slots_assigned:16384",
		"cluster_slots_ok:16384",
		fmt.Sprintf("cluster_known_nodes:%d", len(c.nodes)),
	}
	deadline := time.Now().Add(readyTimeout)
	for _, n := range c.nodes {
		for {
			info, err := redisCmdTimeout(n.Addr(), time.Second, "CLUSTER", "INFO")
			if err == nil {
				for _, w := range want {
					if !strings.Contains(info, w+"\r\n") {
						err = fmt.Errorf("CLUSTER INFO lacks %s:\n%s", w, info)
						break
					}
				}
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redis cluster node %s not ok after %v: %v\n%s", n.Addr(), readyTimeout, err, logTail(n.logPath))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}
