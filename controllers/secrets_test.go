package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/controllers"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

func TestMissingSecretOrKeyIsNamed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.apply(e.sale("orphan", 10).redisSecret("nowhere"))
	fs := e.waitFor("orphan", settle, "SecretNotFound", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonSecretNotFound))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); !strings.Contains(c.Message, `"nowhere"`) {
		t.Fatalf("message does not name the Secret: %s", c.Message)
	}
	if conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue) {
		t.Fatal("seeded without its Secret")
	}
	if fs.Status.ObservedGeneration != 0 {
		t.Fatalf("observedGeneration %d: nothing of the spec was applied", fs.Status.ObservedGeneration)
	}
	// The Secret appears, but without the key.
	e.create(e.secret("nowhere", map[string]string{"adresses": sharedRedis.Addr()}))
	fs = e.waitFor("orphan", settle, "SecretKeyMissing", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonSecretKeyMissing))
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); !strings.Contains(c.Message, `"addresses"`) {
		t.Fatalf("message does not name the key: %s", c.Message)
	}
	// Fixed: the sale seeds.
	var s corev1.Secret
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "nowhere"}, &s); err != nil {
		t.Fatal(err)
	}
	s.Data = map[string][]byte{"addresses": []byte(sharedRedis.Addr())}
	if err := k8s.Update(context.Background(), &s); err != nil {
		t.Fatal(err)
	}
	e.waitFor("orphan", settle, "Seeded", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionSeeded, metav1.ConditionTrue)
	})
}

// A Secret deleted during the sale (a rotation by delete and recreate, a GitOps
// prune) is named in Ready, and the pause switch still closes the sale through
// the connections opened before.
func TestSecretDeletedDuringTheSaleStillPauses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	stop := e.startController()
	fs := e.openSale("rotated", 10)
	eng := e.engineFor(fs, sharedRedis.Addr())
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "waiting-room", Namespace: e.ns}}
	if err := k8s.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	e.waitFor("rotated", settle, "SecretNotFound", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonSecretNotFound))
	updateSpec(t, e.ns, "rotated", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	fs = e.waitFor("rotated", settle, "Paused", phaseIs(flashsalev1alpha1.PhasePaused))
	if fs.Status.ObservedGeneration == fs.Generation {
		t.Fatal("observedGeneration moved while the spec's Secret is missing")
	}
	if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c == nil || c.Reason != controllers.ReasonSecretNotFound {
		t.Fatalf("Ready while the Secret is missing: %+v", c)
	}
	if r, err := eng.Reserve(ctx, "late-buyer", "r", 1); err != nil || r.Reason != stock.StatePaused {
		t.Fatalf("reserve while paused: %+v %v", r, err)
	}
	// The replicas still follow the spec; the pods stay as they are, since
	// new ones would not find the Secret.
	before := e.deployment("rotated-reserve").Spec.Template
	// The placement first: the reconcile that applies the scale has seen it.
	updateSpec(t, e.ns, "rotated", func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Pods = &flashsalev1alpha1.PodsSpec{NodeSelector: map[string]string{"pool": "drop"}}
	})
	kubectl(t, "scale", "flashsale", "rotated", "-n", e.ns, "--replicas=3")
	testharness.Eventually(t, settle, "the reserve Deployment at 3 replicas", func() bool {
		return *e.deployment("rotated-reserve").Spec.Replicas == 3
	})
	if after := e.deployment("rotated-reserve").Spec.Template; !equality.Semantic.DeepEqual(before, after) {
		t.Fatalf("the reserve pods rolled while the Secret is missing: %+v", after.Spec.NodeSelector)
	}
	// A Deployment that lost its labels meanwhile gets them back.
	update(t, e.deployment("rotated-reserve"), func(d *appsv1.Deployment) { delete(d.Labels, controllers.LabelManagedBy) })
	testharness.Eventually(t, settle, "the managed-by label back", func() bool {
		return e.deployment("rotated-reserve").Labels[controllers.LabelManagedBy] == controllers.ManagedBy
	})
	// An operator restarted meanwhile has no connections to go on with: it
	// checks nothing, and does not present what it found before as current.
	stop()
	e.startController()
	fs = e.waitFor("rotated", settle, "Admitting Unknown", func(fs *flashsalev1alpha1.FlashSale) bool {
		return conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionUnknown)
	})
	for _, c := range []string{flashsalev1alpha1.ConditionRedisHealthy, flashsalev1alpha1.ConditionLedgerHealthy, flashsalev1alpha1.ConditionLedgerFailoverSafe} {
		if !conditionIs(fs, c, metav1.ConditionUnknown) {
			t.Errorf("%s after a restart without the Secret: %+v", c, meta.FindStatusCondition(fs.Status.Conditions, c))
		}
	}
	// The Secret is back: Ready no longer names it.
	e.create(e.secret("waiting-room", map[string]string{"hmac-key": admissionKey}))
	e.waitFor("rotated", settle, "Secret found again", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
		return c != nil && c.Reason != controllers.ReasonSecretNotFound &&
			conditionIs(fs, flashsalev1alpha1.ConditionAdmitting, metav1.ConditionFalse) && // paused
			conditionIs(fs, flashsalev1alpha1.ConditionRedisHealthy, metav1.ConditionTrue) &&
			conditionIs(fs, flashsalev1alpha1.ConditionLedgerHealthy, metav1.ConditionTrue)
	})
}

// The data-plane pods read their Secrets once, from their environment: a
// change to a value they read changes their pod template's fingerprint, so
// their Deployment rolls them onto it. The sweeper does not read the
// admission key, so a rotated admission key leaves its pods alone.
func TestSecretChangeRollsThePodsThatReadIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("rolled", 10)
	fingerprints := func() (reserve, sweeper string) {
		for _, c := range []struct {
			name string
			out  *string
		}{{"rolled-reserve", &reserve}, {"rolled-sweeper", &sweeper}} {
			*c.out = e.deployment(c.name).Spec.Template.Annotations[controllers.AnnotationSecrets]
		}
		return reserve, sweeper
	}
	var r0, s0 string
	testharness.Eventually(t, settle, "fingerprints on both pod templates", func() bool {
		r0, s0 = fingerprints()
		return r0 != "" && s0 != ""
	})
	for _, secret := range []string{e.redisAddr, e.dsn, admissionKey} {
		if strings.Contains(r0+s0, secret) {
			t.Fatal("a fingerprint shows a Secret value")
		}
	}
	e.setSecret("waiting-room", "hmac-key", "a-rotated-admission-key-0123456789")
	var r1, s1 string
	testharness.Eventually(t, settle, "the reserve pods rolled", func() bool { r1, s1 = fingerprints(); return r1 != r0 })
	if s1 != s0 {
		t.Fatal("a rotated admission key rolled the sweeper, which does not read it")
	}
	// The key it replaced is kept for the tokens signed with it: the reserve
	// pods roll onto both; a previous key too short to be one is named.
	e.setSecret("waiting-room", "hmac-key"+controllers.AdmissionPreviousSuffix, "short")
	e.waitFor("rolled", settle, "SecretKeyMissing naming the previous key", func(fs *flashsalev1alpha1.FlashSale) bool {
		c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
		return c != nil && c.Reason == controllers.ReasonSecretKeyMissing && strings.Contains(c.Message, `"hmac-key.previous"`)
	})
	e.setSecret("waiting-room", "hmac-key"+controllers.AdmissionPreviousSuffix, admissionKey)
	testharness.Eventually(t, settle, "the reserve pods rolled onto the previous key too", func() bool {
		r, s := fingerprints()
		if s != s0 {
			t.Fatal("the previous admission key rolled the sweeper, which does not read it")
		}
		if r == r1 {
			return false
		}
		r1 = r
		return true
	})
	var previous *corev1.EnvVar
	for _, v := range e.deployment("rolled-reserve").Spec.Template.Spec.Containers[0].Env {
		if v.Name == config.EnvAdmissionKeyPrevious {
			previous = &v
		}
	}
	if previous == nil || previous.ValueFrom == nil || previous.ValueFrom.SecretKeyRef == nil {
		t.Fatalf("the reserve pods have no %s from a Secret", config.EnvAdmissionKeyPrevious)
	}
	if ref := previous.ValueFrom.SecretKeyRef; ref.Name != "waiting-room" || ref.Key != "hmac-key.previous" || ref.Optional == nil || !*ref.Optional {
		t.Fatalf("the reserve pods' %s: %+v, want the optional key hmac-key.previous of waiting-room", config.EnvAdmissionKeyPrevious, previous)
	}

	e.setSecret("shop-ledger", "dsn", e.dsn+"&application_name=flashsale-rolled")
	testharness.Eventually(t, settle, "both rolled", func() bool {
		r2, s2 := fingerprints()
		return r2 != r1 && s2 != s1
	})
}

// Secrets made from files that end in a newline work: the operator strips
// trailing CR and LF from the DSN and the Redis password as the pods do.
func TestSecretsWithATrailingNewline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.setSecret("shop-ledger", "dsn", e.dsn+"\n")
	e.startController()
	e.openSale("newline", 10)
}

// A secretRef renamed (a kustomize secretGenerator's new suffix) to a Secret
// whose values do not connect leaves the pods on the Secret they run with:
// rolled onto the new one, they would not start. Once it connects, they roll.
func TestSecretRenamedToOneThatDoesNotConnectKeepsThePods(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sharedRedis.Addr(), sharedPG)
	e.startController()
	e.openSale("renamed", 10)
	port, err := testharness.FreePort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	dsnSecret := func(name string) string {
		t.Helper()
		for _, env := range e.deployment(name).Spec.Template.Spec.Containers[0].Env {
			if env.Name == config.EnvPostgresDSN {
				return env.ValueFrom.SecretKeyRef.Name
			}
		}
		t.Fatalf("%s reads no DSN", name)
		return ""
	}
	e.create(e.secret("shop-ledger-v2", map[string]string{"dsn": fmt.Sprintf("postgres://u@127.0.0.1:%d/db?sslmode=disable", port)}))
	updateSpec(t, e.ns, "renamed", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Postgres.SecretRef.Name = "shop-ledger-v2" })
	e.waitFor("renamed", settle, controllers.ReasonLedgerUnreachable, reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonLedgerUnreachable))
	time.Sleep(2 * time.Second) // refreshes that would roll the pods
	for _, d := range []string{"renamed-reserve", "renamed-sweeper"} {
		if got := dsnSecret(d); got != "shop-ledger" {
			t.Fatalf("%s rolled onto Secret %q, which does not connect", d, got)
		}
	}
	e.setSecret("shop-ledger-v2", "dsn", e.dsn)
	testharness.Eventually(t, settle, "the pods on the new Secret", func() bool {
		return dsnSecret("renamed-reserve") == "shop-ledger-v2" && dsnSecret("renamed-sweeper") == "shop-ledger-v2"
	})
}

// A Secret is rotated to values that do not connect (a ledger DSN or Redis
// address nothing answers at): as with a Secret gone, the sale goes on being
// gated with the connections opened before (pausing it still closes it), its
// pods are not rolled onto the new values, and Ready and a Warning say what
// is wrong.
func TestSecretRotatedToADeadServerStillPauses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, secret, key, reason string
		dead                      func(port int) string
		alive                     func(e *env) string
	}{
		{"ledger", "shop-ledger", "dsn", controllers.ReasonLedgerUnreachable,
			func(port int) string { return fmt.Sprintf("postgres://u@127.0.0.1:%d/db?sslmode=disable", port) },
			func(e *env) string { return e.dsn }},
		{"redis", "shop-redis", "addresses", controllers.ReasonRedisUnreachable,
			func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) },
			func(e *env) string { return e.redisAddr }},
		{"ledger DSN that does not parse", "shop-ledger", "dsn", controllers.ReasonLedgerSecretInvalid,
			func(port int) string {
				return fmt.Sprintf("host=127.0.0.1 port=%d password = Zz9secret sslmode=requir", port)
			},
			func(e *env) string { return e.dsn }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, sharedRedis.Addr(), sharedPG)
			e.startController()
			fs := e.openSale("rotated", 10)
			markReady(t, e.ns, "rotated-reserve") // buyers reach it: Admitting
			eng := e.engineFor(fs, sharedRedis.Addr())
			port, err := testharness.FreePort() // nothing listens there
			if err != nil {
				t.Fatal(err)
			}
			fingerprint := func() string {
				return e.deployment("rotated-reserve").Spec.Template.Annotations[controllers.AnnotationSecrets]
			}
			before := fingerprint()
			e.setSecret(tc.secret, tc.key, tc.dead(port))
			fs = e.waitFor("rotated", settle, tc.reason, reasonIs(flashsalev1alpha1.ConditionReady, tc.reason))
			if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); !strings.Contains(c.Message, "still served and gated") ||
				!strings.Contains(c.Message, fmt.Sprintf("Secret %q", tc.secret)) {
				t.Fatalf("Ready %+v", c)
			}
			// The connections in use are fine, and the status says so.
			for _, c := range []string{flashsalev1alpha1.ConditionLedgerHealthy, flashsalev1alpha1.ConditionRedisHealthy, flashsalev1alpha1.ConditionAdmitting} {
				if !conditionIs(fs, c, metav1.ConditionTrue) {
					t.Errorf("%s: %+v", c, meta.FindStatusCondition(fs.Status.Conditions, c))
				}
			}
			// A Warning says it too: the health conditions stay True, so
			// their alerts stay silent.
			if !hasEventSaying(t, e.ns, "rotated", tc.reason, "do not open") {
				t.Fatalf("no %s Warning for the rotation", tc.reason)
			}
			noSecretIn(t, e.ns, fs, "Zz9secret")
			updateSpec(t, e.ns, "rotated", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
			e.waitFor("rotated", settle, "Paused", phaseIs(flashsalev1alpha1.PhasePaused))
			if r, err := eng.Reserve(context.Background(), "late-buyer", "r", 1); err != nil || r.Reason != stock.StatePaused {
				t.Fatalf("reserve while paused: %+v %v", r, err)
			}
			// Once, though the connections were retried all along.
			if n := countSent(t, e.ns, "rotated", tc.reason); n != 1 {
				t.Fatalf("%d %s Warnings for one rotation, want 1", n, tc.reason)
			}
			// The pods are not rolled onto values the operator could not connect with.
			if got := fingerprint(); got != before {
				t.Fatalf("the reserve pods were rolled onto the dead server: fingerprint %q → %q", before, got)
			}
			e.setSecret(tc.secret, tc.key, tc.alive(e))
			e.waitFor("rotated", settle, "Ready no longer "+tc.reason, func(fs *flashsalev1alpha1.FlashSale) bool {
				c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady)
				return c != nil && c.Reason != tc.reason
			})
		})
	}
}

// An operator that starts while a sale's admission or ledger Secret is
// missing has no connections to go on with, yet the pause switch still
// closes the sale: closing needs only the Redis Secret.
func TestSecretMissingAfterARestartStillPauses(t *testing.T) {
	t.Parallel()
	for _, secret := range []string{"waiting-room", "shop-ledger"} {
		t.Run(secret, func(t *testing.T) {
			e := newEnv(t, sharedRedis.Addr(), sharedPG)
			stop := e.startController()
			fs := e.openSale("restarted", 10)
			eng := e.engineFor(fs, sharedRedis.Addr())
			ctx := context.Background()
			if err := k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: e.ns}}); err != nil {
				t.Fatal(err)
			}
			e.waitFor("restarted", settle, "SecretNotFound", reasonIs(flashsalev1alpha1.ConditionReady, controllers.ReasonSecretNotFound))
			stop()
			e.startController()
			updateSpec(t, e.ns, "restarted", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
			fs = e.waitFor("restarted", settle, "Paused", phaseIs(flashsalev1alpha1.PhasePaused))
			if c := meta.FindStatusCondition(fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c == nil || c.Reason != controllers.ReasonSecretNotFound {
				t.Fatalf("Ready while the Secret is missing: %+v", c)
			}
			if r, err := eng.Reserve(ctx, "late-buyer", "r", 1); err != nil || r.Reason != stock.StatePaused {
				t.Fatalf("reserve while paused: %+v %v", r, err)
			}
		})
	}
}
