package controllers

import (
	"strings"
	"testing"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

func TestRunIDsChanged(t *testing.T) {
	status := []flashsalev1alpha1.RedisServerStatus{{Address: "a:6379", RunID: "r1"}, {Address: "b:6379", RunID: "r2"}}
	for _, tc := range []struct {
		name   string
		status []flashsalev1alpha1.RedisServerStatus
		memory map[string]string
		now    map[string]string
		want   string // "" for no change, else a word of the reason
	}{
		{"a new sale", nil, nil, map[string]string{"a:6379": "r1"}, ""},
		{"the same servers", status, nil, map[string]string{"a:6379": "r1", "b:6379": "r2"}, ""},
		{"restarted, seen in status (operator restarted too)", status, nil, map[string]string{"a:6379": "r9", "b:6379": "r2"}, "restarted"},
		{"restarted, seen in memory", nil, map[string]string{"a:6379": "r1"}, map[string]string{"a:6379": "r9"}, "restarted"},
		{"a replica promoted in a failover", status, nil, map[string]string{"a:6379": "r1", "c:6379": "r3"}, "now holds shards"},
		{"a master gone, its slots on a known one", status, nil, map[string]string{"a:6379": "r1"}, ""},
		{"memory is newer than a stale status", status, map[string]string{"a:6379": "r9", "b:6379": "r2"}, map[string]string{"a:6379": "r9", "b:6379": "r2"}, ""},
		{"the same servers under new addresses", status, nil, map[string]string{"redis-0.shop:6379": "r1", "redis-1.shop:6379": "r2"}, ""},
		{"a new address and a new process", status, nil, map[string]string{"redis-0.shop:6379": "r7", "b:6379": "r2"}, "now holds shards"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &campaignConn{runIDs: tc.memory}
			why, changed := c.runIDsChanged(tc.status, tc.now)
			if changed != (tc.want != "") || !strings.Contains(why, tc.want) {
				t.Fatalf("changed %v, why %q; want %q", changed, why, tc.want)
			}
		})
	}
	if got := redisServers(map[string]string{"b:1": "y", "a:1": "x"}); len(got) != 2 || got[0].Address != "a:1" || got[1].RunID != "y" {
		t.Fatalf("redisServers %+v", got)
	}
}
