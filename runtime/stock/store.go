package stock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultBackstop is how long a paid reservation's hash is kept from its
// commit mark: it answers the paid request's retries until then, and the
// ledger after. A held reservation's hash has no TTL: it lives as long as
// its expiry-index entry, until the sweeper (or a cancel) gives its units
// back, however late that is; a hash that expired first would take with it
// what the units to give back were, when the ledger has no row to say. A
// campaign whose reservations live longer sets BackstopFor their lifetime.
const DefaultBackstop = 24 * time.Hour

// BackstopFor is the paid-hash lifetime of a campaign whose reservations
// may be held for lifetime (TTL plus grace): DefaultBackstop beyond it, so
// that it is never shorter than a reservation's own life.
func BackstopFor(lifetime time.Duration) time.Duration {
	return addCapped(DefaultBackstop, max(lifetime, 0))
}

// maxBackstop bounds the hash TTL: Redis refuses EXPIRE times that overflow,
// and a duration sum could.
const maxBackstop = 10 * 365 * 24 * time.Hour

// addCapped is a + b (both at least 0), at most maxBackstop, without overflow.
func addCapped(a, b time.Duration) time.Duration {
	return min(a+min(b, maxBackstop), maxBackstop)
}

// Store runs the scripts of one campaign's shards.
type Store struct {
	rdb      redis.UniversalClient
	campaign string
	shards   []Keys
	backstop time.Duration
	servers  sync.Map // server address -> *serverScript
	pipeline PipelineConfig
}

// New returns the Store of a campaign with the given number of shards.
func New(rdb redis.UniversalClient, campaign string, shards int) *Store {
	ks := make([]Keys, shards)
	for i := range ks {
		ks[i] = ShardKeys(campaign, i)
	}
	return &Store{rdb: rdb, campaign: campaign, shards: ks, backstop: DefaultBackstop, pipeline: testDefaultPipeline}
}

// WithBackstop sets the paid reservation hash TTL (see BackstopFor); call it before
// the Store is used.
func (s *Store) WithBackstop(d time.Duration) *Store {
	s.backstop = d
	return s
}

// WithPipeline batches concurrent reserve calls to one server into
// pipelines (see PipelineConfig); call it before the Store is used.
func (s *Store) WithPipeline(c PipelineConfig) *Store {
	s.pipeline = c
	return s
}

// Shards is the number of shards.
func (s *Store) Shards() int { return len(s.shards) }

// Client is the Redis client the store runs on.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// Keys returns the key names of shard n.
func (s *Store) Keys(n int) Keys { return s.shards[n] }

// node is the client of the server holding key: the client itself, or the
// cluster master of the key's slot.
func (s *Store) node(ctx context.Context, key string) (*redis.Client, error) {
	switch c := s.rdb.(type) {
	case *redis.Client:
		return c, nil
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	}
	return nil, fmt.Errorf("unsupported redis client %T", s.rdb)
}

// redirected asks the cluster client to reload its slot map when a call that
// went straight to a node failed for a reason the map may explain: MOVED or
// ASK (a slot moved), CLUSTERDOWN, or no answer at all (a node down, maybe
// failed over). The caller's retry then goes to the right server.
func (s *Store) redirected(ctx context.Context, err error) {
	c, ok := s.rdb.(*redis.ClusterClient)
	if !ok || err == nil {
		return
	}
	var reply redis.Error
	if !errors.As(err, &reply) || redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") ||
		redis.HasErrorPrefix(err, "CLUSTERDOWN") {
		c.ReloadState(ctx)
	}
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		return atoi64(x)
	}
	return 0
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func atoi64(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
