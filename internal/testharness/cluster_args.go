package testharness

// StartRedisClusterArgs is StartRedisCluster (three masters, no replicas)
// whose nodes get extra redis-server arguments, from nodeArgs called once
// per node before it starts: a TLS port of its own, say.
func StartRedisClusterArgs(nodeArgs func() ([]string, error)) (*RedisCluster, error) {
	cli, err := lookBinary("redis-cli", "redis-tools")
	if err != nil {
		return nil, err
	}
	c := &RedisCluster{cli: cli}
	for range clusterMasters {
		extra, err := nodeArgs()
		if err != nil {
			_ = c.closeNodes()
			return nil, err
		}
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
