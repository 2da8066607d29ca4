package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
)

// AnnotationStandbysNeverPromoted lists, comma-separated, the
// application_names of the ledger's standbys that are never promoted (a
// managed service's read replicas beside its storage-level HA, a reporting
// replica): LedgerFailoverSafe counts them as it counts a backup tool's WAL
// client, as no failover target, reported only when one is synchronous.
const AnnotationStandbysNeverPromoted = "flashsale.dev/ledger-standbys-never-promoted"

// replicationVerdict is LedgerFailoverSafe's verdict: whether a failover of
// the ledger to a standby keeps every commit the sale answered for, and why.
type replicationVerdict struct {
	safe            bool
	reason, message string
}

// readReplication asks the ledger how its commits reach its standbys. A
// ledger that does not answer is reported by the phases that need it, and
// LedgerFailoverSafe keeps what it said.
func (r *FlashSaleReconciler) readReplication(ctx context.Context, s *scope) {
	ctx, cancel := context.WithTimeout(ctx, replaceTimeout)
	defer cancel()
	rep, err := s.conn.engine.LedgerReplication(ctx)
	if err != nil {
		log.FromContext(ctx).V(1).Info("ledger replication not read", "err", err)
		return
	}
	s.replication = judgeReplication(neverPromoted(rep, s.fs.Annotations[AnnotationStandbysNeverPromoted]))
}

// neverPromoted moves the standbys that names lists
// (AnnotationStandbysNeverPromoted) to the clients that are no failover
// target.
func neverPromoted(r engine.Replication, names string) engine.Replication {
	skip := map[string]bool{}
	for _, n := range strings.Split(names, ",") {
		if n = strings.TrimSpace(n); n != "" {
			skip[n] = true
		}
	}
	if len(skip) == 0 {
		return r
	}
	standbys := make([]engine.Standby, 0, len(r.Standbys))
	r.BackupClients = slices.Clone(r.BackupClients)
	for _, sb := range r.Standbys {
		if skip[sb.Name] {
			r.BackupClients = append(r.BackupClients, sb)
		} else {
			standbys = append(standbys, sb)
		}
	}
	r.Standbys = standbys
	return r
}

// judgeReplication: a ledger streaming to a standby is failover safe when a
// commit waits for a synchronous standby (synchronous_standby_names, and
// synchronous_commit on, remote_write or remote_apply). Which standby a
// failover promotes is the HA manager's (CloudNativePG and Patroni promote
// a synchronous one). A role that may read sync_state (pg_monitor) also has
// two mistakes found: a backup tool's WAL client synchronous (a commit may
// return once only it has the commit), and standbys none of which the
// setting names (all async). A potential standby (named, not chosen yet, or
// catching up) is a candidate: with none synchronous, commits wait.
func judgeReplication(r engine.Replication) *replicationVerdict {
	const loses = "a failover to one loses the last reservations and payments the sale answered for (a paid order is PENDING again, and a rebuild sells its unit twice)"
	var backups []engine.Standby
	for _, c := range r.BackupClients {
		if c.SyncState == "sync" || c.SyncState == "quorum" {
			backups = append(backups, c)
		}
	}
	allAsync := true
	for _, sb := range r.Standbys {
		allAsync = allAsync && sb.SyncState == "async"
	}
	switch {
	case len(r.Standbys) == 0:
		msg := "PostgreSQL streams its WAL to no standby: nothing a failover could promote has fewer commits than it"
		if len(r.BackupClients) > 0 {
			msg += fmt.Sprintf(" (it streams to %s, no failover target)", listed(r.BackupClients))
		}
		return &replicationVerdict{safe: true, reason: ReasonNoStandby, message: msg}
	case r.SynchronousStandbyNames == "":
		return &replicationVerdict{reason: ReasonAsynchronousStandby, message: fmt.Sprintf(
			"PostgreSQL streams to %s asynchronously (synchronous_standby_names is empty): a commit returns before any standby has it, so %s; make the replication synchronous, or never promote %s",
			standbys(r.Standbys), loses, them(r.Standbys))}
	case r.SynchronousCommit == "local" || r.SynchronousCommit == "off":
		return &replicationVerdict{reason: ReasonLocalCommit, message: fmt.Sprintf(
			"synchronous_commit is %s: a commit returns without waiting for the synchronous standbys (synchronous_standby_names %s) of the %s PostgreSQL streams to, so %s; set it to on for the ledger's role and database",
			r.SynchronousCommit, r.SynchronousStandbyNames, standbys(r.Standbys), loses)}
	case len(backups) > 0:
		return &replicationVerdict{reason: ReasonAsynchronousStandby, message: fmt.Sprintf(
			"synchronous_standby_names %s lets a client that is no failover target (a backup tool's, or one the sale's %s annotation names) stand for a standby (%s): a commit may return once only it has the commit, before the %s PostgreSQL streams to, so %s; name the standbys instead",
			r.SynchronousStandbyNames, AnnotationStandbysNeverPromoted, listed(backups), standbys(r.Standbys), loses)}
	case allAsync:
		return &replicationVerdict{reason: ReasonAsynchronousStandby, message: fmt.Sprintf(
			"synchronous_standby_names %s names none of the %s PostgreSQL streams to: a commit waits for none of them, so %s; name them in it",
			r.SynchronousStandbyNames, standbys(r.Standbys), loses)}
	}
	return &replicationVerdict{safe: true, reason: ReasonSynchronousStandby, message: fmt.Sprintf(
		"PostgreSQL streams to %s, and a commit waits for synchronous_standby_names %s (synchronous_commit %s)",
		standbys(r.Standbys), r.SynchronousStandbyNames, r.SynchronousCommit)}
}

// standbysNamed is how many standbys a message names: a cluster has a few.
const standbysNamed = 5

// standbys is "1 standby (pg-b)", "2 standbys (pg-b sync, pg-c potential)"
// when their sync_state is known, or "7 standbys (a, b, c, d, e and 2 more)".
func standbys(list []engine.Standby) string {
	noun := "standbys"
	if len(list) == 1 {
		noun = "standby"
	}
	return fmt.Sprintf("%d %s (%s)", len(list), noun, listed(list))
}

// listed is "pg-b sync, pg-c potential", at most standbysNamed of them.
func listed(list []engine.Standby) string {
	shown := make([]string, 0, standbysNamed)
	for _, sb := range list[:min(len(list), standbysNamed)] {
		shown = append(shown, strings.TrimSpace(sb.Name+" "+sb.SyncState))
	}
	names := strings.Join(shown, ", ")
	if more := len(list) - len(shown); more > 0 {
		names += fmt.Sprintf(" and %d more", more)
	}
	return names
}

func them(list []engine.Standby) string {
	if len(list) == 1 {
		return "it"
	}
	return "them"
}
