package stock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// ErrServerChanged means the connection a reserve script load ran on was lost
// between reading the server's run id and loading the script: the server may
// have restarted, so nothing was loaded. Retry.
var ErrServerChanged = errors.New("the Redis server connection was lost while loading the reserve script")

// serverScript is what a Store knows of one Redis server: the run id the
// reserve script was last loaded there for.
type serverScript struct {
	loading chan struct{}                // capacity 1: one load at a time
	loaded  atomic.Pointer[loadedScript] // nil until the first load
	batch   batcher                      // reserve calls waiting for a pipeline (PipelineConfig)
}

type loadedScript struct{ runID string }

func (s *Store) server(addr string) *serverScript {
	if v, ok := s.servers.Load(addr); ok {
		return v.(*serverScript)
	}
	v, _ := s.servers.LoadOrStore(addr, &serverScript{loading: make(chan struct{}, 1), batch: batcher{wake: make(chan struct{}, 1)}})
	return v.(*serverScript)
}

// loadReserve loads the reserve script on the server process behind node, for
// that process's run id, and returns what it loaded. seen is what the caller
// found loaded before the server answered NOSCRIPT (nil: nothing yet); when
// another caller has loaded since, its load is returned and no load is made.
// Waiting for another caller's load ends with ctx, so a hung server does not
// hold callers past their deadlines.
func (s *Store) loadReserve(ctx context.Context, node *redis.Client, srv *serverScript, seen *loadedScript) (*loadedScript, error) {
	select {
	case srv.loading <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the reserve script to load: %w", ctx.Err())
	}
	defer func() { <-srv.loading }()
	if cur := srv.loaded.Load(); cur != nil && cur != seen {
		return cur, nil
	}
	id, err := loadReserveScript(ctx, node.Options())
	if err != nil {
		return nil, err
	}
	cur := &loadedScript{runID: id}
	srv.loaded.Store(cur)
	return cur, nil
}

// loadReserveScript reads the server's run id and loads the reserve script
// body carrying it, both over one connection that is never redialled. A
// connection does not outlive its server process, so the body can only be
// loaded into the process whose run id it carries: loaded into a restarted
// process, it would accept that process's older data as verified. Through a
// pool, with its retries and fresh connections, a restart between the two
// commands would do exactly that.
func loadReserveScript(ctx context.Context, o *redis.Options) (string, error) {
	c := redis.NewClient(&redis.Options{
		Addr: o.Addr, Dialer: dialOnce(o.Dialer), OnConnect: o.OnConnect, TLSConfig: o.TLSConfig,
		Username: o.Username, Password: o.Password, DB: o.DB, Protocol: o.Protocol,
		CredentialsProvider: o.CredentialsProvider, CredentialsProviderContext: o.CredentialsProviderContext,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		PoolSize: 1, MaxRetries: -1,
	})
	defer c.Close()
	id, err := runID(ctx, c)
	if err != nil {
		return "", err
	}
	if testHookRunIDRead != nil {
		testHookRunIDRead()
	}
	if err := ReserveScriptFor(id).Load(ctx, c).Err(); err != nil {
		return "", err
	}
	return id, nil
}

// testHookRunIDRead, when set by a test, runs between the two commands of a load.
var testHookRunIDRead func()

// dialOnce lets dial make one connection; later attempts fail with
// ErrServerChanged. Failed attempts do not count.
func dialOnce(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var dialed atomic.Bool
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dialed.Load() {
			return nil, ErrServerChanged
		}
		conn, err := dial(ctx, network, addr)
		if err == nil {
			dialed.Store(true)
		}
		return conn, err
	}
}
