package ledger

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/jackc/pgx/v5/pgxpool"
)

func countVersions(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(testCtx(t), sqlTestCountVersions).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestOpenPoolSize(t *testing.T) {
	t.Parallel()
	dsn := newDSN(t, testPG)
	if got := openLedger(t, dsn).Pool().Config().MaxConns; got != DefaultMaxConns {
		t.Errorf("default MaxConns = %d, want %d", got, DefaultMaxConns)
	}
	if got := openLedger(t, dsn+"&pool_max_conns=5").Pool().Config().MaxConns; got != 5 {
		t.Errorf("MaxConns with pool_max_conns=5 = %d", got)
	}
}

func TestMigrateIdempotent(t *testing.T) {
	t.Parallel()
	l := newLedger(t) // Open migrates once
	migs, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(migs) == 0 || migs[0].version != 1 {
		t.Fatalf("migrations: %+v", migs)
	}
	for range 2 {
		if err := Migrate(testCtx(t), l.Pool()); err != nil {
			t.Fatal(err)
		}
	}
	if n := countVersions(t, l.Pool()); n != len(migs) {
		t.Fatalf("%d versions recorded, want %d", n, len(migs))
	}
	for _, table := range []string{"flashsale_campaigns", "flashsale_shards", "flashsale_orders",
		"flashsale_late_payments", "flashsale_allocation_changes", "flashsale_schema_migrations"} {
		var ok bool
		if err := l.Pool().QueryRow(testCtx(t), sqlTestTableExists, table).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Errorf("table %s missing", table)
		}
	}
}

func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(testCtx(t), newDSN(t, testPG)+"&pool_max_conns=10")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const n = 10
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = Migrate(testCtx(t), pool)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Migrate #%d: %v", i, err)
		}
	}
	migs, _ := loadMigrations()
	if got := countVersions(t, pool); got != len(migs) {
		t.Fatalf("%d versions recorded, want %d", got, len(migs))
	}
}

func TestMigrateRefusesEditedMigration(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	if _, err := l.Pool().Exec(testCtx(t), sqlTestEditChecksum); err != nil {
		t.Fatal(err)
	}
	err := Migrate(testCtx(t), l.Pool())
	if err == nil || !strings.Contains(err.Error(), "changed after it was applied") {
		t.Fatalf("Migrate after edit: %v", err)
	}
}

// A role without CREATE on the schema (what the reserve and sweeper pods
// need at least: read and write the tables) opens a ledger that another role
// has migrated: an up-to-date schema is only read.
func TestOpenWithoutCreatePrivilege(t *testing.T) {
	t.Parallel()
	dsn := newDSN(t, testPG)
	l := openLedger(t, dsn) // migrates as the superuser
	role := "limited_" + strings.ReplaceAll(uniqueID("r"), "-", "_")
	ctx := testCtx(t)
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`REVOKE CREATE ON SCHEMA public FROM PUBLIC`,
		`GRANT USAGE ON SCHEMA public TO ` + role,
		`GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO ` + role,
		`GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO ` + role,
	} {
		if _, err := l.Pool().Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	limitedDSN := strings.Replace(dsn, "://postgres@", "://"+role+"@", 1)
	if limitedDSN == dsn {
		t.Fatalf("cannot make a DSN for %s from %s", role, dsn)
	}
	limited, err := Open(ctx, limitedDSN)
	if err != nil {
		t.Fatalf("open without CREATE: %v", err)
	}
	defer limited.Close()
	c := newCampaign(t, limited, 10, 1)
	m := limited.NewMaterializer(MaterializerConfig{})
	defer m.Close()
	if err := m.Submit(ctx, pendingOrder(c, "u", 0, time.Hour)); err != nil {
		t.Fatalf("write as %s: %v", role, err)
	}
}

// A PostgreSQL host that accepts and never answers: Open gives up after its
// default connect timeout when the DSN sets none.
func TestOpenGivesUpOnASilentServer(t *testing.T) {
	silent := testharness.StartSilentServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	l, err := Open(ctx, "postgres://u@"+silent.Addr()+"/db?sslmode=disable")
	if err == nil {
		l.Close()
		t.Fatal("Open succeeded against a server that never answers")
	}
	if took := time.Since(start); took > defaultConnectTimeout+20*time.Second {
		t.Fatalf("Open gave up after %s, want about %s", took, defaultConnectTimeout)
	}
}

// A DSN that cannot be parsed is refused with a reason and without itself:
// pgx's own message quotes it, redacting the password only where it can
// find it, and this error reaches logs and the FlashSale's status.
func TestOpenNeverQuotesABadDSN(t *testing.T) {
	const secret = "Zz9secret"
	for _, tc := range []struct{ dsn, why string }{
		{"host=127.0.0.1 user=u password = " + secret + " dbname=x sslmode=requir", "sslmode"},
		{`host=127.0.0.1 password='a\' ` + secret + `' sslmode=bogus`, "sslmode"},
		{"postgres://u:" + secret + "@127.0.0.1:port/db", "port"},
		{"postgres://u:pa%zz" + secret + "@127.0.0.1/db", "URL"},
		// pgx's own message quotes the word after the first space.
		{"host=127.0.0.1 password=correct " + secret + " battery staple", "keyword/value"},
		{"postgres://u:" + secret + "@127.0.0.1/db?pool_max_conns=many", "pool_max_conns"},
		{"postgres://u:" + secret + "@127.0.0.1/db?connect_timeout=soon", "connect_timeout"},
		{"host=127.0.0.1 password=" + secret + " user", "keyword/value"},
	} {
		_, err := Open(context.Background(), tc.dsn)
		if !errors.Is(err, ErrBadDSN) {
			t.Fatalf("%q: %v, want ErrBadDSN", tc.dsn, err)
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "127.0.0.1") || strings.Contains(err.Error(), "%zz") {
			t.Errorf("the error quotes the DSN: %v", err)
		}
		if !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%q: the error %q does not say why (%s)", tc.dsn, err, tc.why)
		}
	}
}
