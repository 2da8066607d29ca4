package api

import (
	"hash/maphash"
	"math"
	"sync"
	"time"
)

// limiter is a per-user token bucket, in process and per replica.
//
// Why not in Redis: the point of the design is one Redis call per reservation, and
// a shared limiter would add a round trip (and a hot key) to every request. The
// limit here protects this replica from one buyer's retry loop; the waiting room
// in front paces buyers globally, and the per-user unit limit (maxPerUser) is
// enforced atomically by the reserve script, so an approximate, per-replica rate
// limit loses nothing. With N replicas a user gets at most N times the rate.
type limiter struct {
	rate   float64 // tokens per second
	burst  float64
	seed   maphash.Seed
	shards [limiterShards]limiterShard
}

// limiterShards spreads the users over independent locks.
const limiterShards = 64

// sweepEvery is how many new users a shard admits between sweeps of idle buckets,
// which keeps memory bounded by the active users without a background goroutine.
const sweepEvery = 1024

type limiterShard struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	added   int
}

type bucket struct {
	tokens float64
	last   time.Time
}

// newLimiter returns nil (no limit) for a rate of zero or less.
func newLimiter(rate float64, burst int) *limiter {
	if rate <= 0 {
		return nil
	}
	l := &limiter{rate: rate, burst: math.Max(1, float64(burst)), seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].buckets = map[string]*bucket{}
	}
	return l
}

// allow takes one token for user; when none is left it says how long until one is.
func (l *limiter) allow(user string, now time.Time) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	s := &l.shards[maphash.String(l.seed, user)%limiterShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.buckets[user]
	if !ok {
		if s.added++; s.added >= sweepEvery {
			s.sweep(now, l.refillTime())
		}
		b = &bucket{tokens: l.burst, last: now}
		s.buckets[user] = b
	}
	if dt := now.Sub(b.last); dt > 0 {
		b.tokens = math.Min(l.burst, b.tokens+dt.Seconds()*l.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// refillTime is how long an empty bucket takes to fill up.
func (l *limiter) refillTime() time.Duration {
	return time.Duration(l.burst / l.rate * float64(time.Second))
}

// sweep drops buckets that would be full by now: forgetting them changes nothing.
func (s *limiterShard) sweep(now time.Time, full time.Duration) {
	s.added = 0
	for u, b := range s.buckets {
		if now.Sub(b.last) >= full {
			delete(s.buckets, u)
		}
	}
}

// size is the number of tracked users, for tests.
func (l *limiter) size() int {
	n := 0
	for i := range l.shards {
		l.shards[i].mu.Lock()
		n += len(l.shards[i].buckets)
		l.shards[i].mu.Unlock()
	}
	return n
}
