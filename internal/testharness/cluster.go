package testharness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// clusterMasters is the number of cluster-enabled nodes; each is a master
// without replicas.
const clusterMasters = 3

// RedisCluster is a Redis Cluster of three masters on 127.0.0.1.
type RedisCluster struct {
	mu     sync.Mutex
	cli    string
	nodes  []*Redis
	closed bool
}

// StartRedisCluster starts three cluster-enabled redis-server processes,
// joins them with `redis-cli --cluster create` and waits until every node
// reports cluster_state:ok with all 16384 slots covered.
func StartRedisCluster() (*RedisCluster, error) {
	cli, err := lookBinary("redis-cli", "redis-tools")
	if err != nil {
		return nil, err
	}
	c := &RedisCluster{cli: cli}
	for range clusterMasters {
		n, err := newRedis(true, nil)
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
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}

func (c *RedisCluster) create() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*readyTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	cmd := exec.CommandContext(ctx, c.cli, append(args, "--cluster-replicas", "0", "--cluster-yes")...)
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
