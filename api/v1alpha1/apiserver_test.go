package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// These tests hold the generated CRD against a real API server (envtest):
// installation, the samples, defaulting and every validation message.

func apiServer(t *testing.T) (client.Client, *testharness.Kube) {
	t.Helper()
	k := testharness.KubeT(t)
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(k.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func minimalSale(name string) *v1alpha1.FlashSale {
	return &v1alpha1.FlashSale{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.FlashSaleSpec{
			SKU: "itm-1", Allocation: 10,
			Redis:     v1alpha1.RedisSpec{SecretRef: v1alpha1.SecretNameReference{Name: "r"}},
			Postgres:  v1alpha1.PostgresSpec{SecretRef: v1alpha1.PostgresSecretKeySelector{Name: "p"}},
			Admission: v1alpha1.AdmissionSpec{SecretRef: v1alpha1.AdmissionSecretKeySelector{Name: "a"}},
		},
	}
}

func TestAgainstTheAPIServer(t *testing.T) {
	c, k := apiServer(t)
	ctx := context.Background()

	t.Run("defaults", func(t *testing.T) {
		fs := minimalSale("minimal")
		if err := c.Create(ctx, fs); err != nil {
			t.Fatal(err)
		}
		got := &v1alpha1.FlashSale{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(fs), got); err != nil {
			t.Fatal(err)
		}
		s := got.Spec
		for _, check := range []struct {
			name string
			ok   bool
		}{
			{"shards 10", ptr.Deref(s.Shards, 0) == 10},
			{"maxPerUser 1", ptr.Deref(s.MaxPerUser, 0) == 1},
			{"ttl 10m", s.Reservation.TTL != nil && s.Reservation.TTL.Duration == 10*time.Minute},
			{"gracePeriod 30s", s.Reservation.GracePeriod != nil && s.Reservation.GracePeriod.Duration == 30*time.Second},
			{"stealProbes 2", ptr.Deref(s.Reservation.StealProbes, -1) == 2},
			{"replicas 2", ptr.Deref(s.Reservation.Replicas, -1) == 2},
			{"sweeper interval 30s", s.Sweeper.Interval != nil && s.Sweeper.Interval.Duration == 30*time.Second},
			{"redis mode standalone", s.Redis.Mode == v1alpha1.RedisModeStandalone},
			{"postgres key dsn", s.Postgres.SecretRef.Key == "dsn"},
			{"admission key hmac-key", s.Admission.SecretRef.Key == "hmac-key"},
		} {
			if !check.ok {
				t.Errorf("default missing: %s (spec %+v)", check.name, s)
			}
		}
	})

	t.Run("invalid", func(t *testing.T) {
		now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
		for _, tc := range []struct {
			name   string
			mutate func(*v1alpha1.FlashSale)
			want   string
		}{
			{"end before start", func(f *v1alpha1.FlashSale) {
				f.Spec.Schedule = &v1alpha1.ScheduleSpec{Start: &metav1.Time{Time: now}, End: &metav1.Time{Time: now.Add(-time.Hour)}}
			}, "schedule.end must be after schedule.start"},
			{"end equal to start", func(f *v1alpha1.FlashSale) {
				f.Spec.Schedule = &v1alpha1.ScheduleSpec{Start: &metav1.Time{Time: now}, End: &metav1.Time{Time: now}}
			}, "schedule.end must be after schedule.start"},
			{"shards 0", func(f *v1alpha1.FlashSale) { f.Spec.Shards = ptr.To[int32](0) }, "spec.shards in body should be greater than or equal to 1"},
			{"shards 1025", func(f *v1alpha1.FlashSale) { f.Spec.Shards = ptr.To[int32](1025) }, "spec.shards in body should be less than or equal to 1024"},
			{"negative allocation", func(f *v1alpha1.FlashSale) { f.Spec.Allocation = -1 }, "spec.allocation in body should be greater than or equal to 0"},
			{"allocation too large", func(f *v1alpha1.FlashSale) { f.Spec.Allocation = 10_000_001 }, "allocation is at most 10000000"},
			{"stealProbes 3", func(f *v1alpha1.FlashSale) { f.Spec.Reservation.StealProbes = ptr.To[int32](3) }, "spec.reservation.stealProbes in body should be less than or equal to 2"},
			{"maxPerUser 0", func(f *v1alpha1.FlashSale) { f.Spec.MaxPerUser = ptr.To[int32](0) }, "spec.maxPerUser in body should be greater than or equal to 1"},
			{"maxPerUser 101", func(f *v1alpha1.FlashSale) { f.Spec.MaxPerUser = ptr.To[int32](101) }, "spec.maxPerUser in body should be less than or equal to 100"},
			{"unknown redis mode", func(f *v1alpha1.FlashSale) { f.Spec.Redis.Mode = "sentinel" }, `spec.redis.mode: Unsupported value: "sentinel"`},
			{"ttl 0s", func(f *v1alpha1.FlashSale) { f.Spec.Reservation.TTL = &metav1.Duration{} }, "reservation.ttl must be at least 1s"},
			{"requestTimeout 11s", func(f *v1alpha1.FlashSale) {
				f.Spec.Reservation.RequestTimeout = &metav1.Duration{Duration: 11 * time.Second}
			}, "reservation.requestTimeout must be at most 10s"},
			{"maxInFlight 0", func(f *v1alpha1.FlashSale) { f.Spec.Reservation.MaxInFlight = ptr.To[int32](0) }, "spec.reservation.maxInFlight in body should be greater than or equal to 1"},
			{"missing sku", func(f *v1alpha1.FlashSale) { f.Spec.SKU = "" }, "spec.sku"},
			{"sku too long", func(f *v1alpha1.FlashSale) { f.Spec.SKU = strings.Repeat("x", 129) }, "spec.sku"},
			// The pods trim the SKU: these would never match the ledger's.
			{"blank sku", func(f *v1alpha1.FlashSale) { f.Spec.SKU = "  " }, "spec.sku"},
			{"sku with a trailing space", func(f *v1alpha1.FlashSale) { f.Spec.SKU = "itm-ps5 " }, "spec.sku"},
			// Names its children cannot carry: a Service named <name>-reserve
			// must be a DNS-1035 label of at most 63 characters.
			{"name of 56 characters", func(f *v1alpha1.FlashSale) { f.Name = "s" + strings.Repeat("x", 55) }, "metadata.name must be at most 55"},
			{"name with a dot", func(f *v1alpha1.FlashSale) { f.Name = "drop.v2" }, "metadata.name must be at most 55"},
			{"name starting with a digit", func(f *v1alpha1.FlashSale) { f.Name = "2026-drop" }, "metadata.name must be at most 55"},
			{"toleration operator in lowercase", func(f *v1alpha1.FlashSale) {
				f.Spec.Pods = &v1alpha1.PodsSpec{Tolerations: []corev1.Toleration{{Key: "drop", Operator: "exists"}}}
			}, "pods.tolerations[].operator must be Equal, Exists, Lt or Gt"},
			{"tolerationSeconds without NoExecute", func(f *v1alpha1.FlashSale) {
				f.Spec.Pods = &v1alpha1.PodsSpec{Tolerations: []corev1.Toleration{{Key: "drop", Operator: corev1.TolerationOpExists, TolerationSeconds: ptr.To[int64](30)}}}
			}, "tolerationSeconds needs effect NoExecute"},
			{"nodeSelector key with two slashes", func(f *v1alpha1.FlashSale) {
				f.Spec.Pods = &v1alpha1.PodsSpec{NodeSelector: map[string]string{"a/b/c": "x"}}
			}, "pods.nodeSelector keys must be label keys"},
			// A name client-go cannot put in a path would block deletion.
			{"secret name with a slash", func(f *v1alpha1.FlashSale) { f.Spec.Redis.SecretRef.Name = "shop/redis" }, "spec.redis.secretRef.name in body should match"},
			{"secret name in capitals", func(f *v1alpha1.FlashSale) { f.Spec.Postgres.SecretRef.Name = "Ledger" }, "spec.postgres.secretRef.name in body should match"},
			{"secret name ..", func(f *v1alpha1.FlashSale) { f.Spec.Admission.SecretRef.Name = ".." }, "spec.admission.secretRef.name in body should match"},
			{"priorityClassName with a space", func(f *v1alpha1.FlashSale) {
				f.Spec.Pods = &v1alpha1.PodsSpec{PriorityClassName: "drop critical"}
			}, "pods.priorityClassName must be a PriorityClass name"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				fs := minimalSale("bad-" + strings.ReplaceAll(tc.name, " ", "-"))
				tc.mutate(fs)
				err := c.Create(ctx, fs)
				if err == nil {
					t.Fatal("the API server accepted it")
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %q does not say %q", err, tc.want)
				}
			})
		}
	})

	// A time the API server's date-time check takes and metav1.Time cannot
	// read would stop every typed List of FlashSales, the operator's cache
	// among them.
	t.Run("schedule times", func(t *testing.T) {
		for i, tc := range []struct {
			start string
			ok    bool
		}{
			{"2026-12-01t09:00:00z", false},
			{"2026-12-01T09:00:00+25:00", false},
			{"2026-12-01T09:00:00.250+01:00", true},
			{"2026-12-01T09:00:00-05:30", true},
		} {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("FlashSale"))
			u.SetNamespace("default")
			u.SetName(fmt.Sprintf("times-%d", i))
			spec, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&minimalSale("x").Spec)
			if err != nil {
				t.Fatal(err)
			}
			spec["schedule"] = map[string]any{"start": tc.start}
			u.Object["spec"] = spec
			err = c.Create(ctx, u)
			if tc.ok != (err == nil) {
				t.Fatalf("start %q: %v", tc.start, err)
			}
		}
		var list v1alpha1.FlashSaleList
		if err := c.List(ctx, &list); err != nil {
			t.Fatalf("a typed List: %v", err)
		}
	})

	t.Run("immutable", func(t *testing.T) {
		fs := minimalSale("immutable")
		if err := c.Create(ctx, fs); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name   string
			mutate func(*v1alpha1.FlashSale)
			want   string
		}{
			{"sku", func(f *v1alpha1.FlashSale) { f.Spec.SKU = "itm-2" }, "sku is immutable"},
			{"shards", func(f *v1alpha1.FlashSale) { f.Spec.Shards = ptr.To[int32](20) }, "shards is immutable"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got := &v1alpha1.FlashSale{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(fs), got); err != nil {
					t.Fatal(err)
				}
				tc.mutate(got)
				err := c.Update(ctx, got)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("update error %v, want %q", err, tc.want)
				}
			})
		}
		// What may change does.
		got := &v1alpha1.FlashSale{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(fs), got); err != nil {
			t.Fatal(err)
		}
		got.Spec.Allocation, got.Spec.Paused = 20, true
		if err := c.Update(ctx, got); err != nil {
			t.Fatalf("allocation and paused must be changeable: %v", err)
		}
	})

	t.Run("samples apply with kubectl", func(t *testing.T) {
		assets, err := testharness.KubeAssets()
		if err != nil {
			t.Fatal(err)
		}
		kubectl := filepath.Join(assets, "kubectl")
		cfg, err := k.Kubeconfig(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(testharness.RepoRoot(), "config", "samples")
		out, err := exec.Command(kubectl, "--kubeconfig", cfg, "apply", "-n", "default", "-k", dir).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl apply -k %s: %v\n%s", dir, err, out)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var list v1alpha1.FlashSaleList
		if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		found := map[string]bool{}
		for _, fs := range list.Items {
			found[fs.Name] = true
		}
		if !found["ps5-drop"] || !found["sneaker-drop"] {
			t.Fatalf("samples not in the API server: %v", found)
		}
		// Each file also applies on its own, as a person would do it.
		for _, e := range entries {
			if e.Name() == "kustomization.yaml" {
				continue
			}
			if out, err := exec.Command(kubectl, "--kubeconfig", cfg, "apply", "-n", "default", "-f", filepath.Join(dir, e.Name())).CombinedOutput(); err != nil {
				t.Fatalf("kubectl apply -f %s: %v\n%s", e.Name(), err, out)
			}
		}
	})
}
