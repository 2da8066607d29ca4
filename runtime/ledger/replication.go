package ledger

import (
	"context"
	"strings"
)

// Replication is what the ledger's server says of the standbys it streams
// its WAL to, as the ledger's role can read it: any role sees a walsender's
// process and its application_name; only one with pg_monitor (or
// pg_read_all_stats) its sync_state.
type Replication struct {
	// Standbys are the physical standbys streaming now, by name. Logical
	// walsenders (change-data-capture, logical replication) are no failover
	// target and are left out.
	Standbys []Standby
	// BackupClients are the WAL clients of backup tools (BackupClientNames):
	// they stream as a standby does but are no failover target. One that is
	// synchronous lets a commit return before any standby has it.
	BackupClients []Standby
	// IdleSlots are the physical replication slots no client streams from
	// now, by name: a standby that restarts, or is cut off, keeps its place
	// in one (CloudNativePG and Patroni give each standby a slot), and the
	// server keeps the WAL it has not received. A slot no standby will use
	// again holds WAL back too. Left out: a slot no client ever streamed
	// from (no restart_lsn), and one whose WAL is gone (wal_status lost:
	// its standby cannot stream from it again without a new base backup).
	// A slot still held by a walsender that has left pg_stat_replication
	// (its client just went) is idle.
	IdleSlots []string
	// SynchronousStandbyNames is the server's synchronous_standby_names:
	// empty, a commit waits for no standby.
	SynchronousStandbyNames string
	// SynchronousCommit is synchronous_commit as the ledger's sessions
	// commit (off is turned on, see sqlDurableCommits): local does not wait
	// for a standby either.
	SynchronousCommit string
}

// Standby is one physical standby streaming from the ledger's server.
type Standby struct {
	// Name is its application_name: a standby's cluster_name (CloudNativePG
	// and Patroni give the instance's), or "walreceiver".
	Name string
	// SyncState is its sync_state (async, potential, sync or quorum), ""
	// when the role may not see it.
	SyncState string
}

// BackupClientNames are the application_names the WAL clients of backup
// tools give by default: a base backup in progress (its WAL stream too),
// pg_receivewal, and Barman's.
var BackupClientNames = []string{"pg_basebackup", "pg_receivewal", "barman_receive_wal", "barman_streaming_backup"}

// sqlReplication reads Replication. A physical walsender is connected to no
// database (datid NULL in pg_stat_activity, which every role may read), and
// every role may read pg_replication_slots.
const sqlReplication = `SELECT coalesce(array_agg(coalesce(nullif(a.application_name, '')::text, '(unnamed)') ORDER BY a.application_name, r.pid), '{}'),
    coalesce(array_agg(coalesce(r.sync_state, '') ORDER BY a.application_name, r.pid), '{}'),
    coalesce(array_agg(coalesce(a.application_name, '') = ANY ($1::text[]) ORDER BY a.application_name, r.pid), '{}'),
    current_setting('synchronous_standby_names'), current_setting('synchronous_commit'),
    (SELECT coalesce(array_agg(s.slot_name::text ORDER BY s.slot_name), '{}') FROM pg_replication_slots s
        WHERE s.slot_type = 'physical' AND NOT s.temporary AND s.restart_lsn IS NOT NULL AND s.wal_status IS DISTINCT FROM 'lost'
        AND (NOT s.active OR s.active_pid NOT IN (SELECT w.pid FROM pg_stat_replication w)))
FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
WHERE a.datid IS NULL`

// Replication reads how the ledger's commits reach its standbys.
func (l *Ledger) Replication(ctx context.Context) (Replication, error) {
	var (
		r            Replication
		names, syncs []string
		backups      []bool
	)
	if err := l.pool.QueryRow(ctx, sqlReplication, BackupClientNames).Scan(&names, &syncs, &backups, &r.SynchronousStandbyNames, &r.SynchronousCommit, &r.IdleSlots); err != nil {
		return Replication{}, failed("replication", err)
	}
	for i, name := range names {
		sb := Standby{Name: name, SyncState: syncs[i]}
		if backups[i] {
			r.BackupClients = append(r.BackupClients, sb)
		} else {
			r.Standbys = append(r.Standbys, sb)
		}
	}
	r.SynchronousStandbyNames = strings.TrimSpace(r.SynchronousStandbyNames)
	return r, nil
}
