package api

import (
	"sync"
	"time"
)

// logSampler lets one log line per key through each second and counts the
// others: during an outage every request fails alike, and a line for each of
// thousands a second would flood the log pipeline without saying more.
type logSampler struct {
	mu   sync.Mutex
	keys map[string]*sampled
}

type sampled struct {
	last       time.Time
	suppressed int
}

// allow reports whether a line for key may be written at now, and how many
// lines for it were held back since the last one written.
func (l *logSampler) allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = map[string]*sampled{}
	}
	k := l.keys[key]
	if k == nil {
		k = &sampled{}
		l.keys[key] = k
	}
	if !k.last.IsZero() && now.Sub(k.last) < time.Second {
		k.suppressed++
		return false, 0
	}
	n := k.suppressed
	k.last, k.suppressed = now, 0
	return true, n
}
