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
// client, as no failover target, reported only when one is synchronous. It
// also names the physical replication slots of clients that are no
// failover target (a backup tool's), which then count for no standby away.
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
// target, and drops the idle replication slots it names (a backup tool's),
// by their own name or by a standby's as Patroni names its slot (slotName),
// so that a replica named once stays no failover target while it restarts.
func neverPromoted(r engine.Replication, names string) engine.Replication {
	skip := map[string]bool{}
	for _, n := range strings.Split(names, ",") {
		if n = strings.TrimSpace(n); n != "" {
			skip[n], skip[slotName(n)] = true, true
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
	r.IdleSlots = slices.DeleteFunc(slices.Clone(r.IdleSlots), func(slot string) bool { return skip[slot] })
	return r
}

// slotName is the replication slot a standby of this application_name holds
// when its HA manager names the slot after it as Patroni does: lower case,
// and every character a slot name may not hold ([a-z0-9_]) an underscore
// (member pg-c, slot pg_c). A name that is a slot name already is itself.
func slotName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '_'
	}, name)
}

// judgeReplication: a ledger streaming to a standby is failover safe when a
// commit waits for a synchronous standby (synchronous_standby_names, and
// synchronous_commit on, remote_write or remote_apply). Which standby a
// failover promotes is the HA manager's (CloudNativePG and Patroni promote
// a synchronous one). A role that may read sync_state (pg_monitor) also has
// two mistakes found: a backup tool's WAL client synchronous (a commit may
// return once only it has the commit), and standbys none of which the
// setting names (all async). A potential standby (named, not chosen yet, or
// catching up) is a candidate: with none synchronous, commits wait. An idle
// physical replication slot is a standby away (restarting, or cut off),
// still a failover target: the verdict holds while it is away rather than
// turning NoStandby until it streams again.
func judgeReplication(r engine.Replication) *replicationVerdict {
	const loses = "a failover to one loses the last reservations and payments the sale answered for (a paid order is PENDING again, and a rebuild sells its unit twice)"
	var backups []engine.Standby
	for _, c := range r.BackupClients {
		if c.SyncState == "sync" || c.SyncState == "quorum" {
			backups = append(backups, c)
		}
	}
	allAsync := len(r.Standbys) > 0
	for _, sb := range r.Standbys {
		allAsync = allAsync && sb.SyncState == "async"
	}
	targets := len(r.Standbys) + len(r.IdleSlots)
	var drop string
	if len(r.IdleSlots) > 0 {
		drop = "; drop a slot no standby will use again (it also holds WAL back)"
	}
	switch {
	case targets == 0:
		msg := "PostgreSQL streams its WAL to no standby: nothing a failover could promote has fewer commits than it"
		if len(r.BackupClients) > 0 {
			msg += fmt.Sprintf(" (it streams to %s, no failover target)", listed(r.BackupClients))
		}
		return &replicationVerdict{safe: true, reason: ReasonNoStandby, message: msg}
	case r.SynchronousStandbyNames == "":
		return &replicationVerdict{reason: ReasonAsynchronousStandby, message: fmt.Sprintf(
			"%s: a commit returns before any standby has it, so %s; make the replication synchronous, or never promote %s%s",
			streams(r, true), loses, them(targets), drop)}
	case r.SynchronousCommit == "local" || r.SynchronousCommit == "off":
		return &replicationVerdict{reason: ReasonLocalCommit, message: fmt.Sprintf(
			"synchronous_commit is %s: a commit returns without waiting for the synchronous standbys (synchronous_standby_names %s) of %s, so %s; set it to on for the ledger's role and database",
			r.SynchronousCommit, r.SynchronousStandbyNames, whom(r), loses)}
	case len(backups) > 0:
		return &replicationVerdict{reason: ReasonAsynchronousStandby, message: fmt.Sprintf(
			"synchronous_standby_names %s lets a client that is no failover target (a backup tool's, or one the sale's %s annotation names) stand for a standby (%s): a commit may return once only it has the commit, before %s, so %s; name the standbys instead",
			r.SynchronousStandbyNames, AnnotationStandbysNeverPromoted, listed(backups), whom(r), loses)}
	case allAsync && len(r.IdleSlots) > 0:
		// The setting names application_names, the slots are named
		// otherwise: it may name a standby away, whose return commits then
		// wait for.
		return &replicationVerdict{reason: ReasonAsynchronousStandby, message: fmt.Sprintf(
			"synchronous_standby_names %s names none of the %s PostgreSQL streams to; unless it names one of the %d away %s, whose return commits then wait for, a commit waits for no standby, so %s; name the standbys (by application_name) in it",
			r.SynchronousStandbyNames, standbys(r.Standbys), len(r.IdleSlots), idleSlots(r.IdleSlots), loses)}
	case allAsync:
		return &replicationVerdict{reason: ReasonAsynchronousStandby, message: fmt.Sprintf(
			"synchronous_standby_names %s names none of %s: a commit waits for none of them, so %s; name them (by application_name) in it",
			r.SynchronousStandbyNames, whom(r), loses)}
	}
	msg := fmt.Sprintf("%s, and a commit waits for synchronous_standby_names %s (synchronous_commit %s)",
		streams(r, false), r.SynchronousStandbyNames, r.SynchronousCommit)
	if len(r.Standbys) == 0 {
		msg += ": commits wait until a standby streams again"
	}
	return &replicationVerdict{safe: true, reason: ReasonSynchronousStandby, message: msg}
}

// streams says whom PostgreSQL streams to, asynchronously or not: "PostgreSQL
// streams asynchronously (synchronous_standby_names is empty) to 1 standby
// (pg-b), 1 more away (its slot pg_c idle)", or, with none streaming, "No
// standby streams from PostgreSQL now, but 2 are away (their slots pg_b,
// pg_c idle)".
func streams(r engine.Replication, async bool) string {
	if len(r.Standbys) == 0 {
		msg := fmt.Sprintf("No standby streams from PostgreSQL now, but %d %s away %s", len(r.IdleSlots), isAre(r.IdleSlots), idleSlots(r.IdleSlots))
		if async {
			msg += ", and synchronous_standby_names is empty"
		}
		return msg
	}
	msg := "PostgreSQL streams to " + standbys(r.Standbys)
	if async {
		msg = "PostgreSQL streams asynchronously (synchronous_standby_names is empty) to " + standbys(r.Standbys)
	}
	if len(r.IdleSlots) > 0 {
		msg += fmt.Sprintf(", %d more away %s", len(r.IdleSlots), idleSlots(r.IdleSlots))
	}
	return msg
}

// whom is whom PostgreSQL streams to, after "of" or "before": "the 1
// standby (pg-b) PostgreSQL streams to and the 1 away (its slot pg_c
// idle)", or "the 2 standbys away (their slots pg_b, pg_c idle)".
func whom(r engine.Replication) string {
	switch {
	case len(r.IdleSlots) == 0:
		return "the " + standbys(r.Standbys) + " PostgreSQL streams to"
	case len(r.Standbys) == 0:
		return fmt.Sprintf("the %s away %s", nouned(len(r.IdleSlots)), idleSlots(r.IdleSlots))
	}
	return fmt.Sprintf("the %s PostgreSQL streams to and the %d away %s", standbys(r.Standbys), len(r.IdleSlots), idleSlots(r.IdleSlots))
}

// idleSlots is "(its slot pg_b idle)" or "(their slots pg_b, pg_c idle)".
func idleSlots(slots []string) string {
	named := make([]engine.Standby, len(slots))
	for i, s := range slots {
		named[i] = engine.Standby{Name: s}
	}
	if len(slots) == 1 {
		return "(its slot " + listed(named) + " idle)"
	}
	return "(their slots " + listed(named) + " idle)"
}

func isAre(slots []string) string {
	if len(slots) == 1 {
		return "is"
	}
	return "are"
}

// standbysNamed is how many standbys a message names: a cluster has a few.
const standbysNamed = 5

// standbys is "1 standby (pg-b)", "2 standbys (pg-b sync, pg-c potential)"
// when their sync_state is known, or "7 standbys (a, b, c, d, e and 2 more)".
func standbys(list []engine.Standby) string {
	return fmt.Sprintf("%s (%s)", nouned(len(list)), listed(list))
}

// nouned is "1 standby" or "2 standbys".
func nouned(n int) string {
	if n == 1 {
		return "1 standby"
	}
	return fmt.Sprintf("%d standbys", n)
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

func them(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}
