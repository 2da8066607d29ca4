// Package stock is the Redis side of a flash sale: sharded stock counters, atomic
// reservation scripts, gates and the per-shard rebuild. Every script touches the keys
// of one shard only, which share one hash tag, so the same code runs on a standalone
// Redis and on a Redis Cluster.
package stock
