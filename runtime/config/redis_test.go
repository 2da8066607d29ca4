package config

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// The clients every process builds never re-send a command on their own:
// no retries (go-redis's default is 3), and in a cluster only masters are
// read, so nothing is read from a lagging replica. The cluster client still
// follows MOVED and ASK (MaxRedirects at its default); its re-sends after a
// timeout are stopped per command (runtime/stock's NoRetry scripts, tested
// in TestStalledScriptsRunOnceOnACluster).
func TestRedisClientsNeverRetry(t *testing.T) {
	standalone := Redis{Mode: RedisStandalone, Addresses: []string{"127.0.0.1:1"}}.Client()
	defer standalone.Close()
	c, ok := standalone.(*redis.Client)
	if !ok {
		t.Fatalf("standalone client is %T", standalone)
	}
	// Options() holds the values after defaults: 0 is "none" there.
	if o := c.Options(); o.MaxRetries != 0 {
		t.Errorf("standalone MaxRetries %d, want none", o.MaxRetries)
	}

	cluster := Redis{Mode: RedisCluster, Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}}.Client()
	defer cluster.Close()
	cc, ok := cluster.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("cluster client is %T", cluster)
	}
	o := cc.Options()
	if o.MaxRetries != -1 {
		t.Errorf("cluster MaxRetries %d, want -1 (none on its nodes)", o.MaxRetries)
	}
	if o.ReadOnly || o.RouteByLatency || o.RouteRandomly {
		t.Errorf("cluster reads from replicas: ReadOnly %v, RouteByLatency %v, RouteRandomly %v", o.ReadOnly, o.RouteByLatency, o.RouteRandomly)
	}
	if o.MaxRedirects < 1 {
		t.Errorf("cluster MaxRedirects %d: MOVED and ASK would not be followed", o.MaxRedirects)
	}
}
