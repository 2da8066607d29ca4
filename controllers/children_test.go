package controllers

import (
	"maps"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

func testSale(mutate ...func(*flashsalev1alpha1.FlashSale)) *flashsalev1alpha1.FlashSale {
	fs := &flashsalev1alpha1.FlashSale{
		ObjectMeta: metav1.ObjectMeta{Name: "ps5-drop", Namespace: "shop", UID: "6f1c1f4e-0000-4000-8000-000000000001"},
		Spec: flashsalev1alpha1.FlashSaleSpec{
			SKU: "itm-ps5-pro", Allocation: 1000,
			Redis:     flashsalev1alpha1.RedisSpec{SecretRef: flashsalev1alpha1.SecretNameReference{Name: "shop-redis"}},
			Postgres:  flashsalev1alpha1.PostgresSpec{SecretRef: flashsalev1alpha1.PostgresSecretKeySelector{Name: "shop-ledger"}},
			Admission: flashsalev1alpha1.AdmissionSpec{SecretRef: flashsalev1alpha1.AdmissionSecretKeySelector{Name: "waiting-room", Key: "key"}},
		},
	}
	for _, m := range mutate {
		m(fs)
	}
	return fs
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		out[e.Name] = e
	}
	return out
}

func TestReserveDeployment(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fs       *flashsalev1alpha1.FlashSale
		replicas int32
		env      map[string]string // plain values
		secrets  map[string][2]string
		cpu      string
	}{
		{
			name: "defaults", fs: testSale(), replicas: 2,
			env: map[string]string{
				config.EnvCampaignID: "6f1c1f4e-0000-4000-8000-000000000001", config.EnvSKU: "itm-ps5-pro",
				config.EnvShards: "10", config.EnvMaxPerUser: "1", config.EnvStealProbes: "2", config.EnvTTL: "10m0s",
				config.EnvGracePeriod: "30s", config.EnvRedisMode: "standalone", config.EnvNamespace: "shop", config.EnvName: "ps5-drop",
				config.EnvListen: ":8080", config.EnvMetricsListen: ":9090", config.EnvDrainDelay: "2s",
				config.EnvRequestTimeout: "5s", config.EnvMaxInFlight: "16384",
			},
			secrets: map[string][2]string{
				config.EnvRedisAddresses: {"shop-redis", "addresses"}, config.EnvPostgresDSN: {"shop-ledger", "dsn"},
				config.EnvAdmissionKey: {"waiting-room", "key"}, config.EnvRedisPassword: {"shop-redis", "password"},
			},
		},
		{
			name: "custom", replicas: 5, cpu: "500m",
			fs: testSale(func(fs *flashsalev1alpha1.FlashSale) {
				fs.Spec.Shards = ptr.To[int32](64)
				fs.Spec.MaxPerUser = ptr.To[int32](3)
				fs.Spec.Redis.Mode = flashsalev1alpha1.RedisModeCluster
				fs.Spec.Reservation = flashsalev1alpha1.ReservationSpec{
					TTL: &metav1.Duration{Duration: 90 * time.Second}, GracePeriod: &metav1.Duration{},
					StealProbes: ptr.To[int32](0), Replicas: ptr.To[int32](5),
					RequestTimeout: &metav1.Duration{Duration: 1500 * time.Millisecond}, MaxInFlight: ptr.To[int32](4096),
					Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}},
				}
			}),
			env: map[string]string{
				config.EnvShards: "64", config.EnvMaxPerUser: "3", config.EnvStealProbes: "0", config.EnvTTL: "1m30s",
				config.EnvGracePeriod: "0s", config.EnvRedisMode: "cluster",
				config.EnvRequestTimeout: "1.5s", config.EnvMaxInFlight: "4096",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ReserveDeployment(tc.fs, "registry.example/flashsale:v1")
			if d.Name != "ps5-drop-reserve" || d.Namespace != "shop" || *d.Spec.Replicas != tc.replicas {
				t.Fatalf("meta/replicas: %s/%s %d", d.Namespace, d.Name, *d.Spec.Replicas)
			}
			if d.Spec.Selector.MatchLabels[LabelComponent] != ComponentReserve || d.Spec.Template.Labels[LabelFlashSale] != "ps5-drop" {
				t.Fatalf("labels %v", d.Spec.Template.Labels)
			}
			pod := d.Spec.Template.Spec
			if len(pod.Containers) != 1 || *pod.AutomountServiceAccountToken || !*pod.SecurityContext.RunAsNonRoot {
				t.Fatalf("pod %+v", pod)
			}
			c := pod.Containers[0]
			if c.Image != "registry.example/flashsale:v1" || len(c.Args) != 1 || c.Args[0] != "reserve" {
				t.Fatalf("container %s %v", c.Image, c.Args)
			}
			sc := c.SecurityContext
			if *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem || sc.Capabilities.Drop[0] != "ALL" || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Fatalf("security context %+v", sc)
			}
			if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" || len(c.Ports) != 2 ||
				c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != 8080 || c.Ports[1].Name != "metrics" || c.Ports[1].ContainerPort != 9090 {
				t.Fatalf("probes or ports %+v", c.Ports)
			}
			// Stopped pods wait for the Service to stop routing to them, move
			// their buyers' connections (2 s), then drain (25 s) inside the
			// grace period.
			if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil ||
				c.Lifecycle.PreStop.Sleep.Seconds != 5 || *pod.TerminationGracePeriodSeconds != 37 {
				t.Fatalf("preStop %+v, grace %v", c.Lifecycle, pod.TerminationGracePeriodSeconds)
			}
			env := envOf(c)
			for k, v := range tc.env {
				if env[k].Value != v || env[k].ValueFrom != nil {
					t.Errorf("env %s = %+v, want %q", k, env[k], v)
				}
			}
			for k, ref := range tc.secrets {
				s := env[k].ValueFrom
				if env[k].Value != "" || s == nil || s.SecretKeyRef.Name != ref[0] || s.SecretKeyRef.Key != ref[1] {
					t.Errorf("env %s must come from Secret %s key %s: %+v", k, ref[0], ref[1], env[k])
				}
			}
			if r := env[config.EnvMemoryLimit].ValueFrom; r == nil || r.ResourceFieldRef == nil || r.ResourceFieldRef.Resource != "limits.memory" ||
				r.ResourceFieldRef.Divisor.String() != "1" {
				t.Errorf("env %s must be the container's memory limit in bytes: %+v", config.EnvMemoryLimit, env[config.EnvMemoryLimit])
			}
			for _, e := range c.Env {
				if e.Name == config.EnvAdmissionKey || e.Name == config.EnvPostgresDSN || e.Name == config.EnvRedisPassword {
					if e.Value != "" {
						t.Errorf("secret %s passed by value", e.Name)
					}
				}
			}
			if tc.cpu != "" && c.Resources.Requests.Cpu().String() != tc.cpu {
				t.Errorf("resources %v", c.Resources)
			}
		})
	}
}

func TestServiceAndSweeper(t *testing.T) {
	fs := testSale(func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Sweeper.Interval = &metav1.Duration{Duration: 5 * time.Second}
	})
	svc := ReserveService(fs)
	if svc.Name != "ps5-drop-reserve" || svc.Spec.Selector[LabelComponent] != ComponentReserve || len(svc.Spec.Ports) != 1 ||
		svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.StrVal != "http" {
		t.Fatalf("service %+v: want the API port only, not the metrics", svc.Spec)
	}
	d := SweeperDeployment(fs, "img")
	c := d.Spec.Template.Spec.Containers[0]
	env := envOf(c)
	if d.Name != "ps5-drop-sweeper" || c.Args[0] != "sweeper" || env[config.EnvSweepInterval].Value != "5s" || env[config.EnvLeaderLock].Value != "postgres" {
		t.Fatalf("sweeper %s %v %v", d.Name, c.Args, env)
	}
	if *d.Spec.Replicas != 2 || d.Spec.Selector.MatchLabels[LabelComponent] != ComponentSweeper {
		t.Fatalf("sweeper replicas/selector")
	}
	if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 40 {
		t.Fatalf("sweeper grace period %v, want 40 s (a pass, the lock, the probes)", g)
	}
	// Least privilege: the sweeper never checks a token, so its pods do not get
	// the admission key; they do get what sweeping needs.
	if _, ok := env[config.EnvAdmissionKey]; ok {
		t.Fatalf("the sweeper got the admission key: %+v", env[config.EnvAdmissionKey])
	}
	if env[config.EnvPostgresDSN].ValueFrom == nil || env[config.EnvRedisAddresses].ValueFrom == nil || env[config.EnvCampaignID].Value != string(fs.UID) {
		t.Fatalf("sweeper env %v", env)
	}
}

func TestDisruptionBudgetsAndSpread(t *testing.T) {
	fs := testSale()
	for _, tc := range []struct {
		component string
		d         *appsv1.Deployment
	}{
		{ComponentReserve, ReserveDeployment(fs, "img")},
		{ComponentSweeper, SweeperDeployment(fs, "img")},
	} {
		pdb := DisruptionBudget(fs, tc.component)
		if pdb.Name != tc.d.Name || pdb.Namespace != "shop" || pdb.Spec.MaxUnavailable.IntValue() != 1 ||
			*pdb.Spec.UnhealthyPodEvictionPolicy != policyv1.IfHealthyBudget {
			t.Fatalf("%s: PodDisruptionBudget %+v", tc.component, pdb)
		}
		// It selects exactly the Deployment's pods.
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(tc.d.Spec.Template.Labels)) ||
			!maps.Equal(pdb.Spec.Selector.MatchLabels, tc.d.Spec.Selector.MatchLabels) {
			t.Fatalf("%s: selector %v, pods %v", tc.component, pdb.Spec.Selector, tc.d.Spec.Template.Labels)
		}
		spread := tc.d.Spec.Template.Spec.TopologySpreadConstraints
		if len(spread) != 1 || spread[0].TopologyKey != "kubernetes.io/hostname" || spread[0].WhenUnsatisfiable != corev1.ScheduleAnyway ||
			!maps.Equal(spread[0].LabelSelector.MatchLabels, tc.d.Spec.Selector.MatchLabels) {
			t.Fatalf("%s: topology spread %+v", tc.component, spread)
		}
	}
}

func TestPodsPlacement(t *testing.T) {
	if d := ReserveDeployment(testSale(), "img"); d.Spec.Template.Spec.NodeSelector != nil || d.Spec.Template.Spec.PriorityClassName != "" {
		t.Fatalf("placement without spec.pods: %+v", d.Spec.Template.Spec)
	}
	pods := &flashsalev1alpha1.PodsSpec{
		ImagePullSecrets:  []corev1.LocalObjectReference{{Name: "registry"}},
		NodeSelector:      map[string]string{"pool": "drop"},
		Tolerations:       []corev1.Toleration{{Key: "drop", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		PriorityClassName: "flash-sale",
	}
	fs := testSale(func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Pods = pods })
	for _, d := range []*appsv1.Deployment{ReserveDeployment(fs, "img"), SweeperDeployment(fs, "img")} {
		spec := d.Spec.Template.Spec
		if !equality.Semantic.DeepEqual(spec.ImagePullSecrets, pods.ImagePullSecrets) || !maps.Equal(spec.NodeSelector, pods.NodeSelector) ||
			!equality.Semantic.DeepEqual(spec.Tolerations, pods.Tolerations) || spec.PriorityClassName != "flash-sale" {
			t.Fatalf("%s: placement %+v", d.Name, spec)
		}
	}
	// The Deployments hold copies: changing one does not change the spec.
	ReserveDeployment(fs, "img").Spec.Template.Spec.NodeSelector["pool"] = "other"
	if pods.NodeSelector["pool"] != "drop" {
		t.Fatal("the Deployment shares the spec's map")
	}
}

// Quantities are rounded up to the millis as the API server stores them, and
// the pod fields the spec may drop are hashed into an annotation. Without
// resources in the spec the reserve pods still request some: a pod without
// requests is the first one evicted under memory pressure.
func TestReserveResourcesAndPodFieldsHash(t *testing.T) {
	if r := ReserveDeployment(testSale(), "img").Spec.Template.Spec.Containers[0].Resources; r.Requests.Cpu().String() != "100m" ||
		r.Requests.Memory().String() != "128Mi" || len(r.Limits) != 0 {
		t.Fatalf("default reserve resources %+v", r)
	}
	fs := testSale(func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Reservation.Resources = &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100u"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500u")},
		}
	})
	d := ReserveDeployment(fs, "img")
	r := d.Spec.Template.Spec.Containers[0].Resources
	if r.Requests.Cpu().String() != "1m" || r.Limits.Cpu().String() != "2m" || r.Requests.Memory().String() != "64Mi" {
		t.Fatalf("resources %+v", r)
	}
	if fs.Spec.Reservation.Resources.Requests.Cpu().String() != "100u" {
		t.Fatal("rounding changed the spec")
	}
	h := d.Annotations[AnnotationPodFields]
	if h == "" || h != ReserveDeployment(fs, "img").Annotations[AnnotationPodFields] {
		t.Fatalf("pod fields hash %q is not stable", h)
	}
	placed := testSale(func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Reservation.Resources = d.Spec.Template.Spec.Containers[0].Resources.DeepCopy()
		fs.Spec.Pods = &flashsalev1alpha1.PodsSpec{NodeSelector: map[string]string{"pool": "drop"}}
	})
	if ReserveDeployment(placed, "img").Annotations[AnnotationPodFields] == h {
		t.Fatal("a nodeSelector does not change the pod fields hash")
	}
}

// The sweeper's resources are the spec's when it sets them (a namespace whose
// ResourceQuota asks every pod for limits), rounded as the reserve pods'
// are, and its small requests otherwise.
func TestSweeperResources(t *testing.T) {
	d := SweeperDeployment(testSale(), "img")
	if r := d.Spec.Template.Spec.Containers[0].Resources; r.Requests.Cpu().String() != "50m" || r.Requests.Memory().String() != "64Mi" || len(r.Limits) != 0 {
		t.Fatalf("default sweeper resources %+v", r)
	}
	fs := testSale(func(fs *flashsalev1alpha1.FlashSale) {
		fs.Spec.Sweeper.Resources = &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500u"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		}
	})
	d = SweeperDeployment(fs, "img")
	r := d.Spec.Template.Spec.Containers[0].Resources
	if r.Requests.Cpu().String() != "100m" || r.Limits.Cpu().String() != "2m" || r.Limits.Memory().String() != "128Mi" {
		t.Fatalf("sweeper resources %+v", r)
	}
	if d.Annotations[AnnotationPodFields] == SweeperDeployment(testSale(), "img").Annotations[AnnotationPodFields] {
		t.Fatal("the sweeper's resources do not change its pod fields hash")
	}
}
