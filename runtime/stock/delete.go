package stock

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// DeleteAll removes every key of the campaign (all shards), for a deleted FlashSale.
func (s *Store) DeleteAll(ctx context.Context) (int, error) {
	var (
		mu      sync.Mutex // ForEachMaster calls in parallel
		deleted int
	)
	// A page of SCAN at a time, its keys unlinked in one pipeline: the server
	// may hold many other keys (a shared Redis), and the sale's committed
	// reservation hashes, one per unit sold.
	scan := func(ctx context.Context, c *redis.Client) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, campaignPattern(s.campaign), 1000).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				// One key per UNLINK: keys of different shards live in
				// different slots (all on this server).
				pipe := c.Pipeline()
				for _, k := range keys {
					pipe.Unlink(ctx, k)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					return err
				}
				mu.Lock()
				deleted += len(keys)
				mu.Unlock()
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		err := c.ForEachMaster(ctx, scan)
		return deleted, err
	case *redis.Client:
		return deleted, scan(ctx, c)
	default:
		return 0, fmt.Errorf("unsupported redis client %T", s.rdb)
	}
}
