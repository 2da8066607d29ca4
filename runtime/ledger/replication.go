package ledger

import (
	"context"
	"strings"
)

// Replication is what the ledger's server says of the standbys it streams
// its WAL to, as any role can read it: a role without pg_monitor sees a
// walsender's process and its application_name, not its sync_state.
type Replication struct {
	// Standbys are the application_names of the physical standbys streaming
	// now (a standby's cluster_name, or "walreceiver"). Logical walsenders
	// (change-data-capture, logical replication) are no failover target and
	// are left out.
	Standbys []string
	// SynchronousStandbyNames is the server's synchronous_standby_names:
	// empty, a commit waits for no standby.
	SynchronousStandbyNames string
	// SynchronousCommit is synchronous_commit as the ledger's sessions
	// commit (off is turned on, see sqlDurableCommits): local does not wait
	// for a standby either.
	SynchronousCommit string
}

// sqlReplication reads Replication. A physical walsender is connected to no
// database (datid NULL in pg_stat_activity, which every role may read). A
// base backup in progress (pg_basebackup's name, its WAL stream too) is no
// standby yet.
const sqlReplication = `SELECT coalesce(array_agg(coalesce(nullif(a.application_name, ''), '(unnamed)') ORDER BY a.application_name), '{}'),
    current_setting('synchronous_standby_names'), current_setting('synchronous_commit')
FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
WHERE a.datid IS NULL AND a.application_name IS DISTINCT FROM 'pg_basebackup'`

// Replication reads how the ledger's commits reach its standbys.
func (l *Ledger) Replication(ctx context.Context) (Replication, error) {
	var r Replication
	if err := l.pool.QueryRow(ctx, sqlReplication).Scan(&r.Standbys, &r.SynchronousStandbyNames, &r.SynchronousCommit); err != nil {
		return Replication{}, failed("replication", err)
	}
	r.SynchronousStandbyNames = strings.TrimSpace(r.SynchronousStandbyNames)
	return r, nil
}
