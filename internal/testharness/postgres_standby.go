package testharness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby makes a streaming standby of pg, as an operator's HA setup
// would: a base backup taken over a replication connection (pg_basebackup
// -R writes primary_conninfo), started on a free port. name becomes its
// cluster_name, which it gives pg as its application_name. It returns once
// pg lists it among its walsenders; Stop and Start restart it, Close stops
// it and removes its files.
func (pg *Postgres) StartStandby(name string) (*Postgres, error) {
	return pg.StartStandbyWithSlot(name, "")
}

// StartStandbyWithSlot is StartStandby streaming from a new physical
// replication slot of pg named slot, as CloudNativePG's and Patroni's
// standbys do: pg keeps the slot, and the WAL the standby has not received,
// while it is away. Closing the standby leaves the slot.
func (pg *Postgres) StartStandbyWithSlot(name, slot string) (*Postgres, error) {
	dir, err := tempDir("pgstandby")
	if err != nil {
		return nil, err
	}
	sb := &Postgres{binDir: pg.binDir, dir: dir, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "postgres.log"),
		cred: pg.cred, extra: append(slices.Clone(pg.extra), "cluster_name="+name)}
	if err := sb.baseBackup(pg, slot); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := sb.startOnFreePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	register(sb)
	if err := waitForWalsender(pg, sb.p, name, "streaming"); err != nil {
		return nil, errors.Join(err, sb.Close())
	}
	return sb, nil
}

func (sb *Postgres) baseBackup(primary *Postgres, slot string) error {
	if sb.cred != nil {
		if err := os.Chown(sb.dir, int(sb.cred.Uid), int(sb.cred.Gid)); err != nil {
			return err
		}
	}
	logPath := filepath.Join(sb.dir, "pg_basebackup.log")
	args := []string{"-D", sb.dataDir, "-R", "-X", "stream", "--checkpoint=fast", "--no-sync",
		"-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", pgSuperuser}
	if slot != "" {
		args = append(args, "--create-slot", "--slot", slot) // -R writes primary_slot_name
	}
	p, err := startProc(logPath, sb.dir, sb.cred, []string{"LC_ALL=C"}, filepath.Join(sb.binDir, "pg_basebackup"), args...)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(readyTimeout):
		return errors.Join(fmt.Errorf("pg_basebackup of port %d not done after %v\n%s", primary.port, readyTimeout, logTail(logPath)), p.kill())
	}
	if p.waitErr != nil {
		return fmt.Errorf("pg_basebackup: %v\n%s", p.waitErr, logTail(logPath))
	}
	return nil
}

// waitForWalsender waits until pg has a walsender of a client named name in
// state (while p, that client's process, runs).
func waitForWalsender(pg *Postgres, p *proc, name, state string) error {
	return waitReady(p, fmt.Sprintf("replication client %s of port %d", name, pg.port), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pg.AdminDSN())
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = $2", name, state).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("port %d has no walsender of %s in state %s yet", pg.port, name, state)
		}
		return nil
	})
}

// receivers numbers the slots of ReceiveLogical.
var receivers atomic.Int64

// ReplicationClient is a client process of pg's replication protocol that
// is no standby: a logical receiver, a WAL receiver or a base backup.
type ReplicationClient struct {
	mu   sync.Mutex
	p    *proc
	dir  string
	pg   *Postgres
	slot string // the logical slot it made, dropped by Close
}

// ReceiveLogical starts pg_recvlogical on db (pg needs wal_level=logical)
// with a new test_decoding slot, writing the changes nowhere, as a
// change-data-capture consumer streams them. It returns once pg lists its
// walsender.
func (pg *Postgres) ReceiveLogical(db string) (*ReplicationClient, error) {
	slot := fmt.Sprintf("flashsale_test_%d_%d", os.Getpid(), receivers.Add(1))
	c, err := pg.replicationClient("pg_recvlogical", "streaming", func(string) ([]string, error) {
		return []string{"-d", db, "--slot", slot, "--create-slot", "--start", "--plugin", "test_decoding", "--file", "/dev/null"}, nil
	})
	if c != nil {
		c.slot = slot
	}
	return c, err
}

// ReceiveWAL starts pg_receivewal into a directory of its own, as a backup
// tool archives the WAL, flushing and reporting each write at once (it can
// then be a synchronous standby without holding commits back). It returns once pg lists its walsender.
func (pg *Postgres) ReceiveWAL() (*ReplicationClient, error) {
	return pg.replicationClient("pg_receivewal", "streaming", func(dir string) ([]string, error) {
		wal := filepath.Join(dir, "wal")
		return []string{"-D", wal, "--synchronous"}, os.Mkdir(wal, 0o700)
	})
}

// SlowBaseBackup starts a base backup of pg at 32 kB/s, its tar written to
// its own log file, so that it runs until closed. It returns once pg lists
// its walsender.
func (pg *Postgres) SlowBaseBackup() (*ReplicationClient, error) {
	return pg.replicationClient("pg_basebackup", "backup", func(string) ([]string, error) {
		return []string{"-D", "-", "-F", "tar", "-X", "none", "--checkpoint=fast", "--max-rate=32k"}, nil
	})
}

// replicationClient runs the client name with args(its own directory) and
// waits for its walsender in state.
func (pg *Postgres) replicationClient(name, state string, args func(dir string) ([]string, error)) (*ReplicationClient, error) {
	dir, err := tempDir(name)
	if err != nil {
		return nil, err
	}
	rest, err := args(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	argv := append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(pg.port), "-U", pgSuperuser}, rest...)
	p, err := startProc(filepath.Join(dir, name+".log"), dir, nil, []string{"LC_ALL=C"}, filepath.Join(pg.binDir, name), argv...)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &ReplicationClient{p: p, dir: dir, pg: pg}
	register(c)
	if err := waitForWalsender(pg, p, name, state); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// Close stops the client, drops the slot it made (when its server still
// runs) and removes its files. It is idempotent.
func (c *ReplicationClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p == nil {
		return nil
	}
	unregister(c)
	err := c.p.kill()
	c.p = nil
	if c.slot != "" {
		err = errors.Join(err, c.dropSlot())
	}
	return errors.Join(err, os.RemoveAll(c.dir))
}

// dropSlot drops the client's slot once its walsender has let it go; a
// server that is down has nothing to drop it from.
func (c *ReplicationClient) dropSlot() error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.pg.AdminDSN())
	if err != nil {
		return nil
	}
	defer conn.Close(context.Background())
	for {
		_, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", c.slot)
		if err != nil {
			return fmt.Errorf("drop slot %s: %w", c.slot, err)
		}
		var left bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", c.slot).Scan(&left); err != nil || !left {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("slot %s still in use: %w", c.slot, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
