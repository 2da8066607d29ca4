package config

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// RedisLogEvery and RedisLogBurst bound go-redis's own log lines (a dial
// failure per pool connection while Redis is down): a burst, then one line
// per interval, each saying how many were dropped since the last.
const (
	RedisLogEvery = 10 * time.Second
	RedisLogBurst = 5
)

// RedisLogSink receives one of go-redis's lines (trimmed) and how many were
// dropped before it.
type RedisLogSink func(msg string, dropped int)

// redisLogger is go-redis's Logging interface over a sink, rate-limited.
type redisLogger struct {
	mu      sync.Mutex
	limit   *rate.Limiter
	dropped int
	sink    RedisLogSink
}

func newRedisLogger(sink RedisLogSink, every time.Duration, burst int) *redisLogger {
	return &redisLogger{limit: rate.NewLimiter(rate.Every(every), burst), sink: sink}
}

func (l *redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	if !l.limit.Allow() {
		l.dropped++
		l.mu.Unlock()
		return
	}
	dropped := l.dropped
	l.dropped = 0
	l.mu.Unlock()
	l.sink(strings.TrimSpace(fmt.Sprintf(format, v...)), dropped)
}

// RouteRedisLogs sends go-redis's own log lines (process-wide: go-redis has
// one logger) to sink, at most RedisLogBurst at once and then one per
// RedisLogEvery, instead of raw lines on standard error.
func RouteRedisLogs(sink RedisLogSink) {
	redis.SetLogger(newRedisLogger(sink, RedisLogEvery, RedisLogBurst))
}

// SlogRedisSink writes go-redis's lines to a data-plane process's logger as
// warnings.
func SlogRedisSink(log *slog.Logger) RedisLogSink {
	return func(msg string, dropped int) {
		log.Warn("redis client", "line", msg, "dropped", dropped)
	}
}
