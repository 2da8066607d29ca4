package controllers_test

import (
	"context"
	"encoding/base64"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// Wrong Redis credentials and an ACL user missing a command the operator needs
// each say so in the Ready reason, and nothing is seeded until they are fixed.
func TestRedisCredentialsAndPermissionsAreNamed(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	admin := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	ctx := context.Background()
	// Everything but INFO, which tells a restarted server from the one checked.
	if err := admin.Do(ctx, "ACL", "SETUSER", "shop", "on", ">s3cret", "~*", "&*", "+@all", "-info").Err(); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, r.Addr(), sharedPG)
	e.create(e.secret("acl-redis", map[string]string{"addresses": r.Addr(), "username": "shop", "password": "wrong"}))
	e.startController()
	e.apply(e.sale("acl", 10).redisSecret("acl-redis"))
	forbidden := func(word string) func(*flashsalev1alpha1.FlashSale) bool {
		return func(fs *flashsalev1alpha1.FlashSale) bool {
			c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
			return c != nil && c.Reason == controllers.ReasonRedisForbidden && strings.Contains(c.Message, word)
		}
	}
	fs := e.waitFor("acl", settle, "RedisForbidden (WRONGPASS)", forbidden("WRONGPASS"))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionRedisHealthy); c == nil || c.Reason != controllers.ReasonForbidden {
		t.Fatalf("RedisHealthy %+v", c)
	}

	e.setSecret("acl-redis", "password", "s3cret")
	e.waitFor("acl", settle, "RedisForbidden (NOPERM info)", forbidden("info"))
	if n, err := admin.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("seeded without the permissions it needs: %d keys, %v", n, err)
	}

	if err := admin.Do(ctx, "ACL", "SETUSER", "shop", "+info").Err(); err != nil {
		t.Fatal(err)
	}
	e.waitFor("acl", settle, "Open with the permission granted", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.Available == 10
	})
}

// A ledger DSN whose role PostgreSQL refuses says so in the Ready reason.
func TestLedgerCredentialsAreNamed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	u, err := url.Parse(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("nobody")
	e.create(e.secret("stranger-ledger", map[string]string{"dsn": u.String()}))
	e.startController()
	e.apply(e.sale("stranger", 10).ledgerSecret("stranger-ledger"))
	fs := e.waitFor("stranger", settle, "LedgerForbidden", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonLedgerForbidden))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy); c == nil || c.Reason != controllers.ReasonForbidden || !strings.Contains(c.Message, `"nobody"`) {
		t.Fatalf("LedgerHealthy %+v", c)
	}
	if conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue) {
		t.Fatal("seeded without its ledger")
	}
}

// Each sale gets its own reservation id key in an immutable Secret owned by
// it, read by the reserve pods: rotating the admission key during the sale
// leaves it, and with it the ids, as they were. A sale whose reserve pods ran
// before the Secret existed gets the key those pods derived from the
// admission key, so its ids do not change either; a Secret deleted while the
// pods read it is not replaced by another key.
func TestReservationIDKeySecret(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	fs := e.apply(e.sale("keyed", 10))
	e.waitFor("keyed", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
	ctx := context.Background()
	name := types.NamespacedName{Namespace: e.ns, Name: "keyed-ids"}
	idKey := func() []byte {
		var s corev1.Secret
		if err := k8s.Get(ctx, name, &s); err != nil {
			t.Fatal(err)
		}
		if !metav1.IsControlledBy(&s, fs) || s.Immutable == nil || !*s.Immutable {
			t.Fatalf("Secret %s: owners %v, immutable %v", name.Name, s.OwnerReferences, s.Immutable)
		}
		k, err := base64.RawURLEncoding.DecodeString(string(s.Data[controllers.SecretKeyIDKey]))
		if err != nil {
			t.Fatalf("id key: %v", err)
		}
		return k
	}
	key := idKey()
	if len(key) != 32 || string(key) == string(config.DeriveIDSecret([]byte(admissionKey))) {
		t.Fatalf("a new sale's id key must be 32 random bytes, got %d bytes", len(key))
	}
	var d appsv1.Deployment
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "keyed-reserve"}, &d); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range d.Spec.Template.Spec.Containers[0].Env {
		if v.Name == config.EnvIDKey && v.ValueFrom != nil && v.ValueFrom.SecretKeyRef != nil &&
			v.ValueFrom.SecretKeyRef.Name == name.Name && v.ValueFrom.SecretKeyRef.Key == controllers.SecretKeyIDKey {
			found = true
		}
	}
	if !found {
		t.Fatalf("the reserve pods do not read %s from Secret %s", config.EnvIDKey, name.Name)
	}

	// The admission key is rotated: the id key stays.
	var adm corev1.Secret
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "waiting-room"}, &adm); err != nil {
		t.Fatal(err)
	}
	adm.Data = map[string][]byte{"hmac-key": []byte("a-rotated-admission-key-0123456789")}
	if err := k8s.Update(ctx, &adm); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // reconciles with the new key
	if got := idKey(); string(got) != string(key) {
		t.Fatal("rotating the admission key changed the id key")
	}

	// Deleted while the reserve pods read it: not replaced by another key,
	// even when their Deployment lost its labels (and with them its place in
	// the controller's cache) at the same time.
	stop()
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "keyed-reserve"}, &d); err != nil {
		t.Fatal(err)
	}
	delete(d.Labels, controllers.LabelManagedBy)
	if err := k8s.Update(ctx, &d); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name.Name, Namespace: e.ns}}); err != nil {
		t.Fatal(err)
	}
	stop = e.startController()
	e.waitFor("keyed", settle, "ChildrenFailed", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
		return c != nil && c.Reason == controllers.ReasonChildrenFailed && strings.Contains(c.Message, "deleted while the reserve pods read it")
	})
	if err := k8s.Get(ctx, name, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the deleted id key Secret was recreated: %v", err)
	}

	// An upgrade from a version without the Secret: the reserve Deployment runs
	// pods that derive the key from the admission key. The key they derive is
	// written, not a new one.
	stop()
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "keyed-reserve"}, &d); err != nil {
		t.Fatal(err)
	}
	c := &d.Spec.Template.Spec.Containers[0]
	c.Env = slices.DeleteFunc(c.Env, func(v corev1.EnvVar) bool { return v.Name == config.EnvIDKey })
	if err := k8s.Update(ctx, &d); err != nil {
		t.Fatal(err)
	}
	e.startController()
	want := config.DeriveIDSecret([]byte("a-rotated-admission-key-0123456789"))
	var s corev1.Secret
	testharness.Eventually(t, settle, "Secret "+name.Name+" recreated", func() bool {
		return k8s.Get(ctx, name, &s) == nil && s.DeletionTimestamp.IsZero()
	})
	if string(s.Data[controllers.SecretKeyIDKey]) != base64.RawURLEncoding.EncodeToString(want) {
		t.Fatal("the recreated id key is not the one the running reserve pods derive")
	}
}

// A ledger Secret whose DSN does not parse is named, and the password it
// holds is shown nowhere: pgx quotes such a DSN in its error, redacting only
// the passwords it can find.
func TestLedgerDSNThatDoesNotParse(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.setSecret("shop-ledger", "dsn", "host=127.0.0.1 user=u password = Zz9secret dbname=x sslmode=requir")
	e.startController()
	e.apply(e.sale("garbled", 10))
	fs := e.waitFor("garbled", settle, controllers.ReasonLedgerSecretInvalid, reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonLedgerSecretInvalid))
	c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
	if !strings.Contains(c.Message, `ledger Secret "shop-ledger" key "dsn"`) || !strings.Contains(c.Message, "sslmode") {
		t.Fatalf("Ready does not say what is wrong where: %s", c.Message)
	}
	if !conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionFalse) {
		t.Fatalf("LedgerHealthy %+v", meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionLedgerHealthy))
	}
	noSecretIn(t, e.ns, fs, "Zz9secret")
	e.setSecret("shop-ledger", "dsn", e.dsn)
	e.waitFor("garbled", settle, "Open", phaseIs(flashsalev1alpha1.PhaseOpen))
}
