package ledger

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

type safeToRetry struct{ error }

func (safeToRetry) SafeToRetry() bool { return true }

// A failed batch gives its units back only when it certainly wrote
// nothing: a session's end (FATAL, PANIC) may follow the commit.
func TestChangedNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"an ERROR", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "23505"}, true},
		{"an ERROR, wrapped", fmt.Errorf("insert: %w", &pgconn.PgError{Severity: "ERROR", Code: "40001"}), true},
		{"never sent", safeToRetry{errors.New("dial")}, true},
		{"a FATAL", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}, false},
		{"a FATAL, translated", &pgconn.PgError{Severity: "SCHWERWIEGEND", SeverityUnlocalized: "FATAL"}, false},
		{"a FATAL from a server before 9.6", &pgconn.PgError{Severity: "FATAL"}, false},
		{"a FATAL of a session's start: authentication", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "28P01"}, true},
		{"a FATAL of a session's start: authorization", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "28000"}, true},
		{"a FATAL of a session's start: no such database", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "3D000"}, true},
		{"a PANIC, whatever its code", &pgconn.PgError{Severity: "PANIC", SeverityUnlocalized: "PANIC", Code: "57P03"}, false},
		{"a FATAL of a session's start: too many connections", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "53300"}, true},
		{"a FATAL of a session's start: the server starting", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P03"}, true},
		{"a pooler's FATAL: protocol violation, may be a lost server", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "08P01"}, false},
		{"a PANIC", &pgconn.PgError{Severity: "PANIC", SeverityUnlocalized: "PANIC", Code: "58030"}, false},
		{"a lost connection", io.ErrUnexpectedEOF, false},
	} {
		if got := changedNothing(c.err); got != c.want {
			t.Errorf("%s (%v): changed nothing %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A writer's session ended by the server while its batch waits (here an
// administrator's pg_terminate_backend, as failover tooling sends) is a
// FATAL: the batch is ambiguous, so its callers hold their units for the
// sweeper to settle, and the next batch goes on a new connection.
func TestMaterializerWriterTerminatedIsAmbiguous(t *testing.T) {
	l := newLedger(t)
	ctx := testCtx(t)
	c := newCampaign(t, l, 10, 1)
	m := l.NewMaterializer(MaterializerConfig{Timeout: time.Minute})
	defer m.Close()
	if err := m.Submit(ctx, pendingOrder(c, "first", 0, time.Hour)); err != nil {
		t.Fatal(err) // the writer's connection is open
	}

	// The campaign row locked: the batch's fence (FOR SHARE) waits on it.
	lock, err := l.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // released either way
	if _, err := lock.Exec(ctx, `SELECT 1 FROM flashsale_campaigns WHERE campaign_id = $1 FOR UPDATE`, c.ID); err != nil {
		t.Fatal(err)
	}
	o := pendingOrder(c, "cut", 0, time.Hour)
	done := make(chan error, 1)
	go func() { done <- m.Submit(ctx, o) }()

	var pid int
	for deadline := time.Now().Add(30 * time.Second); pid == 0; time.Sleep(10 * time.Millisecond) {
		err := l.Pool().QueryRow(ctx, `SELECT COALESCE(max(pid), 0) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock'`,
			defaultApplicationName+"-writer").Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer's batch never waited on the campaign's row")
		}
	}
	if _, err := l.Pool().Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	err = <-done
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57P01" {
		t.Fatalf("Submit whose writer was terminated: %v, want the server's FATAL 57P01", err)
	}
	if !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("Submit whose writer was terminated: %v, want ErrAmbiguous (a FATAL may follow the commit)", err)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var exists bool
	if err := l.Pool().QueryRow(ctx, sqlTestOrderExists, o.ReservationID).Scan(&exists); err != nil || exists {
		t.Fatalf("the terminated batch's row: exists %v, %v; want none (the FATAL came before its commit)", exists, err)
	}
	if err := m.Submit(ctx, pendingOrder(c, "next", 0, time.Hour)); err != nil {
		t.Fatalf("the batch after a terminated writer: %v", err)
	}
}
