package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

func TestLedgerDownStaysClosed(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	e.startController()
	e.openSale("ledgerless", 10)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("ledgerless", settle, "LedgerHealthy False", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse)
	})
	c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy)
	if !strings.Contains(c.Message, "ledger") {
		t.Fatalf("condition %+v", c)
	}
	// kubectl get says so, whatever the phase: not admitting, and why.
	e.waitFor("ledgerless", settle, "Admitting False", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse)
	})
	out := kubectl(t, "get", "fs", "ledgerless", "-n", e.ns, "-o", "wide")
	header, row, _ := strings.Cut(out, "\n")
	cols := map[string]string{}
	for i, name := range strings.Fields(header) {
		if f := strings.Fields(row); i < len(f) {
			cols[name] = f[i]
		}
	}
	if cols["ADMITTING"] != "False" || cols["READY"] != "False" || cols["REASON"] != controllers.ReasonLedgerUnreachable {
		t.Fatalf("kubectl get fs -o wide while the ledger is down:\n%s", out)
	}
	// Redis loses its data while the ledger is down: closed, and it says why.
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	fs = e.waitFor("ledgerless", settle, "failed closed, Redis's loss said", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseFailClosed && conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse) &&
			reasonIs(flashsalev1alpha1.ConditionRedisHealthy, controllers.ReasonRedisDataLost)(fs)
	})
	// Found again by every reconcile while the ledger is down (the status
	// is refreshed every second here): said once.
	time.Sleep(3 * time.Second)
	if n := countSent(t, e.ns, "ledgerless", controllers.ReasonRedisDataLost); n != 1 {
		t.Fatalf("%d RedisDataLost events sent while the ledger is down, want 1", n)
	}
	if conditionIs(fs, flashsalev1alpha1.ConditionReady, metav1.ConditionTrue) {
		t.Fatalf("Ready while the ledger is down: %+v", fs.Status.Conditions)
	}
	// One event when it went down, whatever the reconciles since.
	if !hasEvent(t, e.ns, "ledgerless", controllers.ReasonLedgerUnreachable) {
		t.Fatal("no event when the ledger went down")
	}
	if n := countEvents(t, e.ns, "ledgerless", controllers.ReasonLedgerUnreachable); n != 1 {
		t.Fatalf("%d LedgerUnreachable events", n)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("ledgerless", 30*time.Second, "Open after recovery", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue) && fs.Status.Available == 10
	})
	if !hasEvent(t, e.ns, "ledgerless", controllers.ReasonLedgerRecovered) {
		t.Fatal("no event when the ledger answered again")
	}
	// Found while the ledger was down, and said again once it answered and
	// the loss was recorded.
	if n := countSent(t, e.ns, "ledgerless", controllers.ReasonRedisDataLost); n != 2 {
		t.Fatalf("%d RedisDataLost events sent for one loss, want 2", n)
	}
}

// The ledger back while Redis is still down shows as such, with its event:
// the reconcile stops at Redis before any query of its own reaches the ledger.
func TestLedgerRecoversWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	e.startController()
	e.openSale("both", 10)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("both", settle, "LedgerHealthy False", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse)
	})
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("both", 30*time.Second, "LedgerHealthy True with Redis down", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue)
	})
	if !conditionIs(fs, flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionFalse) {
		t.Fatalf("RedisHealthy %+v", meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy))
	}
	if !hasEvent(t, e.ns, "both", controllers.ReasonLedgerRecovered) {
		t.Fatal("no LedgerRecovered event")
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("both", 30*time.Second, "Open again", phaseIs(flashsalev1alpha1.PhaseOpen))
}

// Whether the ledger is asked again while Redis is down is decided by what
// the controller found on its connections, not by the status: a status
// patched to say the ledger refused the operator (a ping cannot tell that
// apart, so the status could not be trusted to ask) does not keep the
// recovery from showing.
func TestLedgerRecoveryIsNotDecidedByTheStatus(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	e.startController()
	e.openSale("told", 10)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("told", settle, "LedgerHealthy False", reasonIs(flashsalev1alpha1.ConditionLedgerHealthy, controllers.ReasonUnreachable))
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	fs := e.waitFor("told", settle, "RedisHealthy False", reasonIs(flashsalev1alpha1.ConditionRedisHealthy, controllers.ReasonUnreachable))
	before := fs.DeepCopy()
	meta.SetStatusCondition(&fs.Status.Conditions, metav1.Condition{Type: flashsalev1alpha1.ConditionLedgerHealthy, Status: metav1.ConditionFalse,
		Reason: controllers.ReasonForbidden, Message: "a status that lies", ObservedGeneration: fs.Generation})
	if err := k8s.Status().Patch(context.Background(), fs, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("told", 30*time.Second, "LedgerHealthy True with Redis down", reasonIs(flashsalev1alpha1.ConditionLedgerHealthy, controllers.ReasonReachable))
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("told", 30*time.Second, "Open again", phaseIs(flashsalev1alpha1.PhaseOpen))
}

// The pause switch and the schedule's end close the shards while the operator
// cannot reach the ledger, with or without connections of its own: the
// reserve pods may still reach it and would go on selling. Opening waits for
// the ledger.
func TestClosingDoesNotWaitForTheLedger(t *testing.T) {
	t.Parallel()
	pg := testharness.PostgresT(t)
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), pg)
	late := e.lateClock()
	stop := e.startController()
	e.apply(e.sale("unledgered", 10).schedule(time.Time{}, time.Now().Add(time.Hour)))
	fs := e.waitFor("unledgered", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	store := stock.New(rdb, string(fs.UID), 4)
	gates := func() []string {
		states, err := store.State(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, st := range states {
			out = append(out, st.State)
		}
		return out
	}
	every := func(want string) func() bool {
		return func() bool { return !slices.ContainsFunc(gates(), func(g string) bool { return g != want }) }
	}
	ledgerDown := func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse)
	}

	// Restarted while the ledger is down: nothing of its own reaches it.
	stop()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	e.startController()
	updateSpec(t, e.ns, "unledgered", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	testharness.Eventually(t, settle, "every shard PAUSED", every(stock.StatePaused))
	fs = e.waitFor("unledgered", settle, "Paused with the ledger down", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhasePaused && ledgerDown(fs)
	})
	if conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionTrue) {
		t.Fatalf("Admitting while the ledger is down: %+v", fs.Status.Conditions)
	}
	if !hasEvent(t, e.ns, "unledgered", controllers.ReasonGateChanged) {
		t.Fatal("no GateChanged event")
	}

	// The schedule needs no ledger either: a new end reaches the shards, which
	// enforce it by the Redis clock.
	newEnd := time.Now().Add(90 * time.Minute).Truncate(time.Second)
	updateSpec(t, e.ns, "unledgered", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Schedule.End = &metav1.Time{Time: newEnd} })
	testharness.Eventually(t, settle, "every shard with the new end", func() bool {
		states, err := store.State(context.Background())
		return err == nil && !slices.ContainsFunc(states, func(st stock.ShardState) bool { return st.WindowEnd != newEnd.UnixMilli() })
	})

	// Unpaused: the shards stay closed until the ledger answers.
	updateSpec(t, e.ns, "unledgered", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = false })
	time.Sleep(3 * time.Second) // several reconciles (status refresh 1s)
	if g := gates(); slices.Contains(g, stock.StateOpen) {
		t.Fatalf("shards %v opened without the ledger", g)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 30*time.Second, "every shard OPEN once the ledger is back", every(stock.StateOpen))

	// Down again, with the operator's connections open: the end closes it.
	e.waitFor("unledgered", settle, "LedgerHealthy True", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue)
	})
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("unledgered", settle, "LedgerHealthy False", ledgerDown)
	late.Store(true)
	testharness.Eventually(t, settle, "every shard ENDED past the end", every(stock.StateEnded))
	// Ended, not Completed: whether anything is still reserved needs the
	// ledger's counts.
	e.waitFor("unledgered", settle, "Ended", phaseIs(flashsalev1alpha1.PhaseEnded))
	time.Sleep(2 * time.Second)
	if fs := e.get("unledgered"); fs.Status.Phase != flashsalev1alpha1.PhaseEnded {
		t.Fatalf("phase %s with the ledger down past the end, want Ended", fs.Status.Phase)
	}
}

// A ledger that hangs (here: its campaigns table locked) rather than refusing
// does not hold the pause up either: the gate is written before the phases
// that wait on the ledger, within seconds, not at the reconcile's deadline.
func TestClosingDoesNotWaitForAHungLedger(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.statusRefresh = time.Minute // no refresh of its own meanwhile
	e.phaseTimeout = 10 * time.Second
	stop := e.startController()
	fs := e.openSale("stalled", 10)
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	store := stock.New(rdb, string(fs.UID), 4)
	every := func(want string) func() bool {
		return func() bool {
			states, err := store.State(context.Background())
			return err == nil && !slices.ContainsFunc(states, func(st stock.ShardState) bool { return st.State != want })
		}
	}
	time.Sleep(2 * time.Second) // the creation's own reconciles are over
	release := e.holdLedger("LOCK TABLE flashsale_campaigns IN ACCESS EXCLUSIVE MODE")
	updateSpec(t, e.ns, "stalled", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	// Nothing else would close it while the ledger hangs: the operator's
	// connections are open, so no step fails to open them. (The window
	// allows for a reconcile already waiting on the ledger.)
	testharness.Eventually(t, 2*e.phaseTimeout, "every shard PAUSED while the ledger hangs", every(stock.StatePaused))

	// Restarted while it hangs, even to open a connection (the migrations'
	// table locked too): a deletion ends the sale through Redis once the
	// steps waiting on the ledger have given up, and waits.
	stop()
	releaseMigrations := e.holdLedger("LOCK TABLE flashsale_schema_migrations IN ACCESS EXCLUSIVE MODE")
	e.startController()
	ctx := context.Background()
	if err := k8s.Delete(ctx, fs); err != nil {
		t.Fatal(err)
	}
	testharness.Eventually(t, 3*e.phaseTimeout+15*time.Second, "every shard ENDED while the ledger hangs", every(stock.StateEnded))
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "stalled"}, &flashsalev1alpha1.FlashSale{}); err != nil {
		t.Fatalf("deleted while the ledger hangs: %v", err)
	}
	releaseMigrations()
	release()
	e.waitGone("stalled", settle)
}

// The ledger Secret re-pointed at another database during the sale: the
// operator neither seeds nor rebuilds the sale into a ledger that does not
// hold what was sold, says so in Ready (once as an event), and leaves that
// database without the campaign.
func TestLedgerSwitchedToAnotherDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.sellThree(t, "forked")
	otherDSN := e.switchLedger(t)
	fs := e.waitFor("forked", settle, "LedgerMismatch", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonLedgerMismatch))
	if fs.Status.Sold != 3 {
		t.Fatalf("status forgot what was sold: %+v", fs.Status)
	}
	since := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy).LastTransitionTime
	time.Sleep(3500 * time.Millisecond) // a few reconciles, in other seconds
	if c := meta.FindStatusCondition(e.get("forked").Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy); c.Status != metav1.ConditionFalse || !c.LastTransitionTime.Equal(&since) {
		t.Fatalf("LedgerHealthy %s since %s, want False since %s", c.Status, c.LastTransitionTime, since)
	}
	if n := countEvents(t, e.ns, "forked", controllers.ReasonLedgerMismatch); n != 1 {
		t.Fatalf("%d %s events, want 1", n, controllers.ReasonLedgerMismatch)
	}
	assertNoCampaign(t, otherDSN, fs)
}

// sellThree opens a sale of 20 units and sells 3 of them.
func (e *env) sellThree(t *testing.T, name string) *flashsalev1alpha1.FlashSale {
	t.Helper()
	fs := e.openSale(name, 20)
	eng := e.engineFor(fs, sharedRedis.Addr())
	for i := range 3 {
		user := fmt.Sprintf("%s-%d", name, i)
		res := e.reserve(eng, user)
		if _, err := eng.Checkout(context.Background(), user, res.ID, "pay"); err != nil {
			t.Fatal(err)
		}
	}
	e.waitFor(name, settle, "sold 3", func(fs *flashsalev1alpha1.FlashSale) bool { return fs.Status.Sold == 3 })
	return fs
}

// switchLedger points the sales' ledger Secret at a new, empty database.
func (e *env) switchLedger(t *testing.T) (dsn string) {
	t.Helper()
	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	e.setSecret("shop-ledger", "dsn", dsn)
	return dsn
}

// assertNoCampaign fails unless the ledger at dsn has no campaign for fs.
func assertNoCampaign(t *testing.T, dsn string, fs *flashsalev1alpha1.FlashSale) {
	t.Helper()
	ctx := context.Background()
	l, err := ledger.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.GetCampaign(ctx, string(fs.UID)); !errors.Is(err, ledger.ErrCampaignNotFound) {
		t.Fatalf("the other database got the campaign: %v", err)
	}
}

// The ledger Secret re-pointed at another database after Redis lost the sale
// too, and a status that says the sale never ran (restored without it, or
// written wrong): neither store says the sale ran, but its children do (they
// are written only after its first seed, and nothing is sold without them),
// so nothing is seeded afresh to sell the allocation again. Before, the
// status's epoch was the only witness, and a status at 0 seeded the sale anew.
func TestLedgerSwitchedAfterRedisLostTheSaleTooDoesNotSellAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	fs := e.sellThree(t, "forgotten")
	stop()
	ctx := context.Background()
	otherDSN := e.switchLedger(t)
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	store := stock.New(rdb, string(fs.UID), int(*fs.Spec.Shards))
	if _, err := store.DeleteAll(ctx); err != nil {
		t.Fatal(err)
	}
	fs = e.get("forgotten")
	fs.Status = flashsalev1alpha1.FlashSaleStatus{}
	if err := k8s.Status().Update(ctx, fs); err != nil {
		t.Fatal(err)
	}
	e.startController()

	fs = e.waitFor("forgotten", settle, "LedgerMismatch", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonLedgerMismatch))
	time.Sleep(2 * time.Second) // a few reconciles more
	assertNoCampaign(t, otherDSN, fs)
	states, err := store.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(states, func(st stock.ShardState) bool { return st.Present }); i >= 0 {
		t.Fatalf("shard %d seeded again: %+v", i, states[i])
	}
}

// A sale whose PostgreSQL hangs (connections accepted, never answered) does
// not hold up the other sales: they are reconciled, seeded and opened while
// its connection attempt is still waiting.
func TestAStuckLedgerDoesNotHoldUpOtherSales(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	silent := testharness.StartSilentServer(t)
	e.create(e.secret("stuck-ledger", map[string]string{"dsn": "postgres://u@" + silent.Addr() + "/db?sslmode=disable&connect_timeout=60"}))
	e.startController()
	e.apply(e.sale("stuck", 10).ledgerSecret("stuck-ledger"))
	select {
	case <-silent.Accepted:
	case <-time.After(settle):
		t.Fatal("the stuck sale never tried its ledger")
	}
	e.openSale("flowing", 10)
	select {
	case <-silent.FirstClosed:
		t.Fatal("the other sale waited for the stuck sale's connection attempt to end")
	default:
	}
}

// A ledger query that hangs (here behind a table lock) is given up before the
// reconcile's deadline, and the status says the ledger does not answer: the
// status write has time of its own.
func TestHungLedgerQueryIsReportedBeforeTheReconcileDeadline(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	e.apply(e.sale("hung", 10))
	e.waitFor("hung", settle, "Open with the ledger healthy", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue)
	})
	// Seeded without a bound (migrations, children); bounded from here on.
	stop()
	e.reconcileTimeout = 16 * time.Second // 12 s for the phases, 4 s for the status write
	e.startController()
	timeoutsBefore := reconcileTimeouts(t)
	release := e.holdLedger("LOCK TABLE flashsale_campaigns IN ACCESS EXCLUSIVE MODE")
	e.waitFor("hung", 2*e.reconcileTimeout, "LedgerHealthy False", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse)
	})
	// The phases gave up before the reconcile's own deadline did.
	if n := reconcileTimeouts(t) - timeoutsBefore; n != 0 {
		t.Fatalf("%v reconciles ran into their deadline", n)
	}
	release()
	e.waitFor("hung", settle, "LedgerHealthy True again", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue)
	})
}
