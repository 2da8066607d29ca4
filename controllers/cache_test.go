package controllers_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// The manager keeps in memory only what is the sales' own: not the
// namespace's other Deployments, and of Secrets their names and versions
// only (no data, no annotations).
func TestCacheHoldsOnlyTheSalesOwn(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.create(e.foreignDeployment("storefront"))
	big := e.secret("tls-cert", map[string]string{"tls.key": "not for the operator"})
	big.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"stringData":{"tls.key":"not for the operator"}}`}
	e.create(big)
	e.startController()
	e.openSale("own", 10)
	ctx := context.Background()
	c := e.mgr.GetCache()

	cached := func() []string {
		var ds appsv1.DeploymentList
		if err := c.List(ctx, &ds, client.InNamespace(e.ns)); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, d := range ds.Items {
			names = append(names, d.Name)
		}
		slices.Sort(names)
		return names
	}
	testharness.Eventually(t, settle, "the sale's Deployments cached", func() bool { return len(cached()) >= 2 })
	time.Sleep(time.Second) // someone else's Deployment, if cached, shows by now too
	if names := cached(); !slices.Equal(names, []string{"own-reserve", "own-sweeper"}) {
		t.Fatalf("cached Deployments %v, want only the sale's", names)
	}

	var notCached *cache.ErrResourceNotCached
	if err := c.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "tls-cert"}, &corev1.Secret{}); !errors.As(err, &notCached) {
		t.Fatalf("a Secret's data read from the cache: %v (want ErrResourceNotCached)", err)
	}
	var m metav1.PartialObjectMetadata
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	if err := c.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "tls-cert"}, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Annotations) != 0 || len(m.ManagedFields) != 0 || m.ResourceVersion == "" {
		t.Fatalf("cached Secret metadata keeps annotations %v, %d managed fields (resourceVersion %q)",
			m.Annotations, len(m.ManagedFields), m.ResourceVersion)
	}
}

// A child whose labels someone removed drops out of the cache; the
// controller still finds it, and puts the labels back.
func TestChildThatLostItsLabelsIsTakenBack(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("strip", 10)
	ctx := context.Background()
	key := types.NamespacedName{Namespace: e.ns, Name: "strip-reserve"}
	update(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}},
		func(d *appsv1.Deployment) { delete(d.Labels, controllers.LabelManagedBy) })
	testharness.Eventually(t, settle, "the managed-by label back", func() bool {
		var d appsv1.Deployment
		return k8s.Get(ctx, key, &d) == nil && d.Labels[controllers.LabelManagedBy] == controllers.ManagedBy
	})
	// Taken back without a failed write on the way.
	var events corev1.EventList
	if err := k8s.List(ctx, &events, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		if ev.Reason == controllers.ReasonChildrenFailed {
			t.Fatalf("a child could not be written: %s", ev.Message)
		}
	}
}

// countingReader counts the reads that reach the API server.
type countingReader struct {
	client.Reader
	gets atomic.Int64
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	return c.Reader.Get(ctx, key, obj, opts...)
}

// A Secret's data is fetched once per version: refreshes every few seconds cost
// the API server nothing while the Secret does not change.
func TestSecretDataIsReadOncePerVersion(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	ctx := context.Background()
	api := &countingReader{Reader: k8s}
	r := controllers.NewSecretReader(k8s, api) // metadata straight from the API server
	key := types.NamespacedName{Namespace: e.ns, Name: "shop-redis"}
	read := func() string {
		t.Helper()
		var s corev1.Secret
		if err := r.Get(ctx, key, &s); err != nil {
			t.Fatal(err)
		}
		return string(s.Data["addresses"])
	}
	for range 3 {
		if got := read(); got != e.redisAddr {
			t.Fatalf("addresses %q, want %q", got, e.redisAddr)
		}
	}
	if n := api.gets.Load(); n != 1 {
		t.Fatalf("%d reads of an unchanged Secret, want 1", n)
	}
	e.setSecret("shop-redis", "addresses", "127.0.0.1:1")
	if got := read(); got != "127.0.0.1:1" {
		t.Fatalf("after an update: addresses %q", got)
	}
	if n := api.gets.Load(); n != 2 {
		t.Fatalf("%d reads after one update, want 2", n)
	}
	if err := k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "shop-redis"}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Get(ctx, key, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a deleted Secret read as %v", err)
	}
	if n := r.Held(); n != 0 {
		t.Fatalf("%d Secrets held after the only one was deleted", n)
	}

	// A Secret nobody reads any more (its sale deleted, a secretRef renamed)
	// is let go.
	now := time.Now()
	r.SetClock(func() time.Time { return now })
	ledgerKey := types.NamespacedName{Namespace: e.ns, Name: "shop-ledger"}
	if err := r.Get(ctx, ledgerKey, &corev1.Secret{}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(controllers.SecretUnusedFor + 2*time.Minute)
	if err := r.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "waiting-room"}, &corev1.Secret{}); err != nil {
		t.Fatal(err)
	}
	if n := r.Held(); n != 1 {
		t.Fatalf("%d Secrets held, want only the one read last", n)
	}
}

// notYetCached answers NotFound for everything, as a cache that has not seen
// an object yet.
type notYetCached struct{}

func (notYetCached) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	return apierrors.NewNotFound(corev1.Resource("secrets"), key.Name)
}

func (notYetCached) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// A Secret the cache does not show yet (just created, the cache behind) is
// asked of the API server: a NotFound that is only the cache's must not
// skip a deleted sale's cleanup or look like a deleted id key.
func TestSecretTheCacheHasNotSeenIsReadFromTheAPIServer(t *testing.T) {
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	r := controllers.NewSecretReader(notYetCached{}, k8s)
	var s corev1.Secret
	if err := r.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "shop-redis"}, &s); err != nil || string(s.Data["addresses"]) != e.redisAddr {
		t.Fatalf("read %q, %v", s.Data["addresses"], err)
	}
	if err := r.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "absent"}, &s); !apierrors.IsNotFound(err) {
		t.Fatalf("a Secret that does not exist read as %v", err)
	}
}
