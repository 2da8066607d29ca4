package reserve

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// A process allowed fewer open files than its own connections need stops at
// start with an error naming the limit, before it opens the ledger: the
// database is left as it was, no migration run.
func TestTooFewFilesStopBeforeTheLedgerChanges(t *testing.T) {
	startShared(t)
	bin := buildBinary(t)
	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	env := childEnv(
		config.EnvCampaignID+"=c-files", config.EnvNamespace+"=shop", config.EnvName+"=files",
		config.EnvSKU+"=itm-files", config.EnvShards+"=1", config.EnvMaxPerUser+"=1", config.EnvTTL+"=1m",
		config.EnvRedisAddresses+"="+sharedRedis.Addr(),
		config.EnvPostgresDSN+"="+dsn,
		config.EnvAdmissionKey+"=files-admission-key-0123456789",
		config.EnvListen+"=127.0.0.1:0",
	)
	var logs testharness.SyncBuffer
	// 200 files: below the 226 of the process's own share.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proc := exec.CommandContext(ctx, "prlimit", "--nofile=200:200", bin, "reserve")
	proc.Env, proc.Stdout, proc.Stderr = env, &logs, &logs
	proc.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = proc.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() <= 0 {
		t.Fatalf("reserve under 200 open files: %v, want a non-zero exit\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "RLIMIT_NOFILE") {
		t.Fatalf("reserve under 200 open files says nothing of RLIMIT_NOFILE:\n%s", logs.String())
	}

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var tables int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("reserve that could not start left %d tables in the ledger's database, want none", tables)
	}
}
