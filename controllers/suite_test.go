package controllers_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/cmd/manager"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
)

var (
	kube        *testharness.Kube
	k8s         client.WithWatch
	sharedRedis *testharness.Redis
	sharedPG    *testharness.Postgres
)

const admissionKey = "waiting-room-hmac-key-0123456789"

// scenariosAtOnce is how many envtest scenarios run at once when -parallel
// is not given. Each has its own namespace, database, Redis keys and
// manager, and spends its time waiting on reconciles, timers and servers,
// not on a CPU: the default (GOMAXPROCS) would run two at a time.
const scenariosAtOnce = 6

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.UseDevMode(false), zap.WriteTo(io.Discard)))
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(scenariosAtOnce))
	}
	testharness.Main(m, func() (err error) {
		if kube, err = testharness.StartKube(); err != nil {
			return err
		}
		if k8s, err = client.NewWithWatch(kube.Config, client.Options{Scheme: manager.NewScheme()}); err != nil {
			return err
		}
		if sharedRedis, err = testharness.StartRedis(); err != nil {
			return err
		}
		sharedPG, err = testharness.StartPostgres()
		return err
	})
}

// env is one test's namespace, Secrets and servers.
type env struct {
	t         *testing.T
	ns        string
	redisAddr string
	dsn       string
	// deploymentUpdates counts the controller's Updates of Deployments that were written.
	deploymentUpdates atomic.Int64
	// mgr is the running controller's manager, and reconciler its
	// reconciler (startController).
	mgr        ctrl.Manager
	reconciler *controllers.FlashSaleReconciler
	// stale, when set, is what the controller's client reads for that sale.
	stale atomic.Pointer[flashsalev1alpha1.FlashSale]
	// lag, when on, has the controller's client read each Deployment once
	// as it was before the controller's last Update of it.
	lag deploymentLag
	// reconcileTimeout, when set, bounds each reconcile (--reconcile-timeout).
	reconcileTimeout time.Duration
	// phaseTimeout, when set, bounds each phase of a reconcile.
	phaseTimeout time.Duration
	// clock, when set, is the controller's clock.
	clock func() time.Time
	// countsStamp, when set, renews status.countsObservedAt this often.
	countsStamp time.Duration
	// statusRefresh, when set, replaces the tests' 1 s refresh.
	statusRefresh time.Duration
	// rebuildFailpoint, when set, runs before each shard of a rebuild is finished.
	rebuildFailpoint func(namespace, name string, shard int)
	// rebuildBegunFailpoint, when set, runs once a rebuild's start is recorded.
	rebuildBegunFailpoint func(namespace, name string)
	// rebuildStoppedFailpoint, when set, runs when a rebuild is stopped.
	rebuildStoppedFailpoint func(namespace, name string)
	// install, image and ownerStale, when set, are the next controller's
	// (startController).
	install, image string
	ownerStale     time.Duration
	// config, when set, is the next controller's identity (startController).
	config *rest.Config
}

// testClient counts the Updates of Deployments that go through it, and can
// answer a Get of one FlashSale with an old copy, as a cache that lags does.
type testClient struct {
	client.Client
	deploymentUpdates *atomic.Int64
	stale             *atomic.Pointer[flashsalev1alpha1.FlashSale]
	lag               *deploymentLag
}

// deploymentLag is a cache that has not yet seen the controller's own writes
// of Deployments: the first read of one after an Update returns it as it
// was before.
type deploymentLag struct {
	mu     sync.Mutex
	on     bool
	before map[client.ObjectKey]*appsv1.Deployment
}

func (l *deploymentLag) set(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on, l.before = on, nil
}

// remember keeps d as it is before an Update, if the lag is on.
func (l *deploymentLag) remember(d *appsv1.Deployment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.on {
		return
	}
	if l.before == nil {
		l.before = map[client.ObjectKey]*appsv1.Deployment{}
	}
	l.before[client.ObjectKeyFromObject(d)] = d
}

// take returns, once, the copy kept for key.
func (l *deploymentLag) take(key client.ObjectKey) *appsv1.Deployment {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.before[key]
	delete(l.before, key)
	return d
}

func (c testClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	switch o := obj.(type) {
	case *flashsalev1alpha1.FlashSale:
		if old := c.stale.Load(); old != nil && client.ObjectKeyFromObject(old) == key {
			old.DeepCopyInto(o)
			return nil
		}
	case *appsv1.Deployment:
		if old := c.lag.take(key); old != nil {
			old.DeepCopyInto(o)
			return nil
		}
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// Update counts only the updates that were written: one sent from a stale
// copy is refused (a conflict) and changes nothing.
func (c testClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	d, isDeployment := obj.(*appsv1.Deployment)
	var before *appsv1.Deployment
	if isDeployment {
		before = &appsv1.Deployment{}
		if c.Client.Get(ctx, client.ObjectKeyFromObject(d), before) != nil {
			before = nil
		}
	}
	err := c.Client.Update(ctx, obj, opts...)
	if isDeployment && err == nil {
		c.deploymentUpdates.Add(1)
		if before != nil {
			c.lag.remember(before)
		}
	}
	return err
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newEnv makes a namespace with the three Secrets pointing at the given Redis and a
// fresh ledger database on pg.
func newEnv(t *testing.T, redisAddr string, pg *testharness.Postgres) *env {
	t.Helper()
	dsn, err := pg.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ns: "t-" + randomSuffix(), redisAddr: redisAddr, dsn: dsn}
	e.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}})
	e.create(e.secret("shop-redis", map[string]string{"addresses": redisAddr}))
	e.create(e.secret("shop-ledger", map[string]string{"dsn": dsn}))
	e.create(e.secret("waiting-room", map[string]string{"hmac-key": admissionKey}))
	return e
}

func (e *env) secret(name string, data map[string]string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, StringData: data}
}

// foreignDeployment is a Deployment of someone else's in the test's namespace.
func (e *env) foreignDeployment(name string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: name + ":1"}}},
			},
		},
	}
}

func (e *env) create(o client.Object) {
	e.t.Helper()
	if err := k8s.Create(context.Background(), o); err != nil {
		e.t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// startController runs a manager with the FlashSale controller for this test's
// namespace; the returned function stops it (a controller restart is stop + start).
func (e *env) startController() (stop func()) {
	e.t.Helper()
	cfg := kube.Config
	if e.config != nil {
		cfg = e.config
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 manager.NewScheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  controllers.CacheOptions([]string{e.ns}),
		Client:                 controllers.ClientOptions(),
		Controller:             ctrlConfig(e.reconcileTimeout),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	r := &controllers.FlashSaleReconciler{
		Client:        testClient{mgr.GetClient(), &e.deploymentUpdates, &e.stale, &e.lag},
		Recorder:      mgr.GetEventRecorder("flashsale-controller"),
		Image:         cmp.Or(e.image, "flashsale-operator:test"),
		Install:       e.install,
		OwnerStale:    e.ownerStale,
		StatusRefresh: cmp.Or(e.statusRefresh, time.Second),
		PhaseTimeout:  e.phaseTimeout,
		Clock:         e.clock,
		CountsStamp:   e.countsStamp,
	}
	controllers.SetRebuildFailpoint(r, e.rebuildFailpoint)
	controllers.SetRebuildBegunFailpoint(r, e.rebuildBegunFailpoint)
	controllers.SetRebuildStoppedFailpoint(r, e.rebuildStoppedFailpoint)
	if err := r.SetupWithManager(mgr); err != nil {
		e.t.Fatal(err)
	}
	e.mgr = mgr
	e.reconciler = r
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("manager: %v", err)
		}
	}
	e.t.Cleanup(stop)
	return stop
}

// sale is a FlashSale fixture builder.
type sale struct{ fs *flashsalev1alpha1.FlashSale }

func (e *env) sale(name string, allocation int64) *sale {
	return &sale{fs: &flashsalev1alpha1.FlashSale{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: flashsalev1alpha1.FlashSaleSpec{
			SKU: "itm-" + name, Allocation: allocation, Shards: ptr.To[int32](4),
			Reservation: flashsalev1alpha1.ReservationSpec{
				TTL: &metav1.Duration{Duration: time.Minute}, GracePeriod: &metav1.Duration{},
			},
			Redis:     flashsalev1alpha1.RedisSpec{SecretRef: flashsalev1alpha1.SecretNameReference{Name: "shop-redis"}},
			Postgres:  flashsalev1alpha1.PostgresSpec{SecretRef: flashsalev1alpha1.PostgresSecretKeySelector{Name: "shop-ledger"}},
			Admission: flashsalev1alpha1.AdmissionSpec{SecretRef: flashsalev1alpha1.AdmissionSecretKeySelector{Name: "waiting-room"}},
		},
	}}
}

func (s *sale) schedule(start, end time.Time) *sale {
	s.fs.Spec.Schedule = &flashsalev1alpha1.ScheduleSpec{}
	if !start.IsZero() {
		s.fs.Spec.Schedule.Start = &metav1.Time{Time: start}
	}
	if !end.IsZero() {
		s.fs.Spec.Schedule.End = &metav1.Time{Time: end}
	}
	return s
}

func (s *sale) redisSecret(n string) *sale  { s.fs.Spec.Redis.SecretRef.Name = n; return s }
func (s *sale) ledgerSecret(n string) *sale { s.fs.Spec.Postgres.SecretRef.Name = n; return s }

func (e *env) apply(s *sale) *flashsalev1alpha1.FlashSale {
	e.t.Helper()
	e.create(s.fs)
	return s.fs
}

func (e *env) get(name string) *flashsalev1alpha1.FlashSale {
	e.t.Helper()
	fs := &flashsalev1alpha1.FlashSale{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: name}, fs); err != nil {
		e.t.Fatal(err)
	}
	return fs
}

// waitFor polls the FlashSale until cond holds.
// openSale creates the sale and waits until it is Open.
func (e *env) openSale(name string, allocation int64) *flashsalev1alpha1.FlashSale {
	e.t.Helper()
	e.apply(e.sale(name, allocation))
	return e.waitFor(name, settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
}

// update writes a change to obj's current version, read again after a
// conflict: the controller writes the same objects.
func update[T client.Object](t *testing.T, obj T, change func(T)) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		change(obj)
		return k8s.Update(ctx, obj)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// settled waits until nothing has written the sale for a second (the
// creation's own reconciles are over) and returns it.
func (e *env) settled(name string) *flashsalev1alpha1.FlashSale {
	e.t.Helper()
	fs := e.get(name)
	testharness.Eventually(e.t, settle, name+" unchanged for a second", func() bool {
		time.Sleep(time.Second)
		now := e.get(name)
		defer func() { fs = now }()
		return now.ResourceVersion == fs.ResourceVersion
	})
	return fs
}

// holdFinalizer gives the sale another tool's finalizer until the test ends:
// a change to the stored sale that no reconcile follows (no generation,
// label or annotation change) and that leaves its status alone.
func (e *env) holdFinalizer(name string) {
	e.t.Helper()
	const hold = "example.com/hold"
	update(e.t, e.get(name), func(fs *flashsalev1alpha1.FlashSale) { fs.Finalizers = append(fs.Finalizers, hold) })
	e.t.Cleanup(func() {
		update(e.t, e.get(name), func(fs *flashsalev1alpha1.FlashSale) {
			fs.Finalizers = slices.DeleteFunc(fs.Finalizers, func(f string) bool { return f == hold })
		})
	})
}

// deployment reads a Deployment of the test's namespace from the API server.
func (e *env) deployment(name string) *appsv1.Deployment {
	e.t.Helper()
	var d appsv1.Deployment
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: name}, &d); err != nil {
		e.t.Fatal(err)
	}
	return &d
}

func (e *env) waitFor(name string, timeout time.Duration, what string, cond func(*flashsalev1alpha1.FlashSale) bool) *flashsalev1alpha1.FlashSale {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	var fs *flashsalev1alpha1.FlashSale
	for {
		fs = e.get(name)
		if cond(fs) {
			return fs
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s waiting for %s; status: %+v%s", timeout, what, fs.Status, diagnosis(e.ns, name))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitGone waits until the FlashSale is deleted (its finalizer done).
func (e *env) waitGone(name string, timeout time.Duration) {
	e.t.Helper()
	testharness.Eventually(e.t, timeout, name+" gone", func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: name}, &flashsalev1alpha1.FlashSale{}))
	})
}

func conditionIs(fs *flashsalev1alpha1.FlashSale, typ string, status metav1.ConditionStatus) bool {
	return meta.IsStatusConditionPresentAndEqual(fs.Status.Conditions, typ, status)
}

func phaseIs(p flashsalev1alpha1.FlashSalePhase) func(*flashsalev1alpha1.FlashSale) bool {
	return func(fs *flashsalev1alpha1.FlashSale) bool { return fs.Status.Phase == p }
}

// reasonIs holds when condition typ has the given reason.
func reasonIs(typ, reason string) func(*flashsalev1alpha1.FlashSale) bool {
	return func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, typ)
		return c != nil && c.Reason == reason
	}
}

// setSecret sets one key of one of the test's Secrets.
func (e *env) setSecret(name, key, value string) {
	e.t.Helper()
	ctx := context.Background()
	var s corev1.Secret
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: name}, &s); err != nil {
		e.t.Fatal(err)
	}
	s.Data[key] = []byte(value)
	if err := k8s.Update(ctx, &s); err != nil {
		e.t.Fatal(err)
	}
}

// engineFor opens an engine on the sale's Redis and ledger, as a reserve pod would.
func (e *env) engineFor(fs *flashsalev1alpha1.FlashSale, redisAddr string) *engine.Engine {
	e.t.Helper()
	l, err := ledger.Open(context.Background(), e.dsn)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(l.Close)
	rdb := config.Redis{Mode: config.RedisStandalone, Addresses: []string{redisAddr}}.Client()
	e.t.Cleanup(func() { _ = rdb.Close() })
	eng, err := engine.New(engine.Config{
		CampaignID: string(fs.UID), Namespace: fs.Namespace, Name: fs.Name, SKU: fs.Spec.SKU,
		Shards: int(ptr.Deref(fs.Spec.Shards, 10)), MaxPerUser: 1, StealProbes: 2,
		TTL: fs.Spec.Reservation.TTL.Duration, Grace: 0, IDSecret: config.DeriveIDSecret([]byte(admissionKey)),
	}, rdb, l, ledger.MaterializerConfig{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(eng.Close)
	return eng
}

func (e *env) reserve(eng *engine.Engine, user string) engine.Reservation {
	e.t.Helper()
	r, err := eng.Reserve(context.Background(), user, "req", 1)
	if err != nil || r.Outcome != engine.OutcomeReserved {
		e.t.Fatalf("reserve %s: %+v %v", user, r, err)
	}
	return r.Reservation
}

// ctrlConfig lets several managers (controller restarts) register the same
// controller name in one test process.
func ctrlConfig(timeout time.Duration) ctrlconfig.Controller {
	return ctrlconfig.Controller{SkipNameValidation: ptr.To(true), MaxConcurrentReconciles: manager.DefaultOptions().MaxConcurrentReconciles,
		ReconciliationTimeout: timeout}
}

// lateClock makes the controller's clock run 2 h ahead once the returned
// switch is set (before startController).
func (e *env) lateClock() *atomic.Bool {
	var late atomic.Bool
	e.clock = func() time.Time {
		if late.Load() {
			return time.Now().Add(2 * time.Hour)
		}
		return time.Now()
	}
	return &late
}

// holdLedger runs sql (a lock) in a transaction on the test's ledger
// database, and returns what commits it; it is rolled back at the end.
func (e *env) holdLedger(sql string, args ...any) (release func()) {
	e.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		e.t.Fatal(err)
	}
	return func() {
		e.t.Helper()
		if err := tx.Commit(ctx); err != nil {
			e.t.Fatal(err)
		}
	}
}

// waitForLockWaiter waits until a session of the test's ledger database waits
// for a lock.
func (e *env) waitForLockWaiter(what string) {
	e.t.Helper()
	testharness.WaitForLockWaiters(e.t, e.dsn, 1, settle, what)
}
