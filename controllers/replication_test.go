package controllers_test

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/jackc/pgx/v5"
)

// A ledger that streams to a standby without waiting for it is reported:
// LedgerFailoverSafe turns False naming the standby, with a Warning, then
// True once commits wait for it, and False again when they are made local.
// A restart of the standby, which keeps its replication slot, leaves the
// verdict as it is. The sale stays Ready throughout. (The operator's role here is a
// superuser, so the messages carry the standby's sync_state.)
func TestAsynchronousLedgerStandbyIsReported(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t) // its own server: its standbys and settings are the server's
	e := newEnv(t, sharedRedis.Addr(), pg)
	e.startController()
	e.openSale("repl", 10)
	markReady(t, e.ns, "repl-reserve")
	markReady(t, e.ns, "repl-sweeper")
	e.waitFor("repl", settle, "Ready", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonReady))
	e.waitFor("repl", settle, "LedgerFailoverSafe True, no standby", reasonIs(flashsalev1alpha1.ConditionLedgerFailoverSafe, controllers.ReasonNoStandby))

	says := func(status metav1.ConditionStatus, reason, text string) func(*flashsalev1alpha1.FlashSale) bool {
		return func(fs *flashsalev1alpha1.FlashSale) bool {
			c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerFailoverSafe)
			return c != nil && c.Status == status && c.Reason == reason && strings.Contains(c.Message, text)
		}
	}
	standby, err := pg.StartStandbyWithSlot("pg-b", "pg_b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	fs := e.waitFor("repl", settle, "LedgerFailoverSafe False, the standby asynchronous",
		says(metav1.ConditionFalse, controllers.ReasonAsynchronousStandby, "PostgreSQL streams asynchronously (synchronous_standby_names is empty) to 1 standby (pg-b async)"))
	if !conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue) {
		t.Fatalf("Ready is not True beside an asynchronous standby: %+v", meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady))
	}
	// The event names what the refresh that turned the condition False saw:
	// the standby streaming ("streams asynchronously (synchronous_standby_names
	// is empty) to 1 standby"), or its slot idle between its base backup and
	// its first stream ("1 is away (its slot pg_b idle), and
	// synchronous_standby_names is empty"). Both say the setting is empty.
	if !hasEventSaying(t, e.ns, "repl", controllers.ReasonAsynchronousStandby, "synchronous_standby_names is empty") {
		t.Fatal("no AsynchronousStandby event")
	}

	// A replica the shop never promotes, named on the sale, is no failover
	// target; the condition says it is there.
	setNeverPromoted := func(names string) {
		updateSpec(t, e.ns, "repl", func(fs *flashsalev1alpha1.FlashSale) {
			if names == "" {
				delete(fs.Annotations, controllers.AnnotationStandbysNeverPromoted)
				return
			}
			if fs.Annotations == nil {
				fs.Annotations = map[string]string{}
			}
			fs.Annotations[controllers.AnnotationStandbysNeverPromoted] = names
		})
	}
	setNeverPromoted("reporting, pg-b")
	e.waitFor("repl", settle, "LedgerFailoverSafe True, pg-b never promoted",
		says(metav1.ConditionTrue, controllers.ReasonNoStandby, "(it streams to pg-b async, no failover target)"))
	setNeverPromoted("")
	fs = e.waitFor("repl", settle, "LedgerFailoverSafe False again without the annotation",
		says(metav1.ConditionFalse, controllers.ReasonAsynchronousStandby, "PostgreSQL streams asynchronously (synchronous_standby_names is empty) to 1 standby (pg-b async)"))

	// A standby that restarts keeps its slot: the verdict holds while it is
	// away, and the condition does not turn True and back.
	since := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerFailoverSafe).LastTransitionTime
	if err := standby.Stop(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("repl", settle, "LedgerFailoverSafe False while the standby is away",
		says(metav1.ConditionFalse, controllers.ReasonAsynchronousStandby, "No standby streams from PostgreSQL now, but 1 is away (its slot pg_b idle), and synchronous_standby_names is empty"))
	if err := standby.Start(); err != nil {
		t.Fatal(err)
	}
	fs = e.waitFor("repl", settle, "LedgerFailoverSafe False, the standby back",
		says(metav1.ConditionFalse, controllers.ReasonAsynchronousStandby, "PostgreSQL streams asynchronously (synchronous_standby_names is empty) to 1 standby (pg-b async):"))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerFailoverSafe); !c.LastTransitionTime.Equal(&since) {
		t.Fatalf("LedgerFailoverSafe moved while the standby restarted: last transition %v, before the restart %v", c.LastTransitionTime, since)
	}

	// Commits wait for the standby from here on: it must outlive every
	// session that commits, so the settings are put back before it stops.
	admin, err := pgx.Connect(context.Background(), pg.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	set := func(stmts ...string) {
		t.Helper()
		for _, stmt := range append(stmts, `SELECT pg_reload_conf()`) {
			if _, err := admin.Exec(context.Background(), stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
	}
	defer set(`ALTER SYSTEM RESET synchronous_standby_names`, `ALTER SYSTEM RESET synchronous_commit`)
	set(`ALTER SYSTEM SET synchronous_standby_names = '"pg-b"'`)
	e.waitFor("repl", settle, "LedgerFailoverSafe True, the standby synchronous",
		says(metav1.ConditionTrue, controllers.ReasonSynchronousStandby, `PostgreSQL streams to 1 standby (pg-b sync), and a commit waits for synchronous_standby_names "pg-b"`))
	if !hasEventSaying(t, e.ns, "repl", controllers.ReasonFailoverSafe, "LedgerFailoverSafe again: PostgreSQL streams to 1 standby (pg-b sync)") {
		t.Fatal("no FailoverSafe event")
	}

	set(`ALTER SYSTEM SET synchronous_commit = 'local'`)
	e.waitFor("repl", settle, "LedgerFailoverSafe False, commits local",
		says(metav1.ConditionFalse, controllers.ReasonLocalCommit, "synchronous_commit is local"))
	if !hasEventSaying(t, e.ns, "repl", controllers.ReasonLocalCommit, "synchronous_commit is local") {
		t.Fatal("no LocalCommit event")
	}
}
