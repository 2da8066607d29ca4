package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// Component names of the children; they appear in names and labels.
const (
	ComponentReserve = "reserve"
	ComponentSweeper = "sweeper"
	ComponentIDs     = "ids" // the Secret holding the sale's reservation id key
)

// SecretKeyIDKey is the key of the reservation id key in the <name>-ids Secret.
const SecretKeyIDKey = "id-key"

// AnnotationSecrets on a pod template is a fingerprint of the Secret values
// its pods read from their environment: when one changes, the template
// changes and the Deployment rolls its pods onto the new values.
const AnnotationSecrets = "flashsale.dev/secrets-fingerprint"

// AnnotationPodFields on a child Deployment is a hash of the pod fields the
// spec may set and drop (placement, resources) as last applied: a field the
// spec drops changes it, so the removal is applied, while a field someone
// else adds (a policy engine's toleration) is left alone.
const AnnotationPodFields = "flashsale.dev/pod-fields"

// The reserve pods' requests when spec.reservation.resources is not set:
// 1,024 buyers at once fit in 128Mi (docs/operations.md, sizing).
const (
	DefaultReserveCPURequest    = "100m"
	DefaultReserveMemoryRequest = "128Mi"
)

// AnnotationTemplateGeneration on a child Deployment is the generation in
// which the operator last changed its pod template, then "/" and a digest of
// that template. Until the Deployment controller has observed that
// generation the pods run the old template, even when the same write scaled
// the Deployment (a scale alone is no rollout).
const AnnotationTemplateGeneration = "flashsale.dev/template-generation"

// Labels on every child. The local pod runner and kubectl selectors use them.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelComponent = "app.kubernetes.io/component"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelFlashSale = "flashsale.dev/flashsale"
	ManagedBy      = "flashsale-operator"
)

// settings are a FlashSale's spec with the CRD defaults applied, so builders also
// work on objects that never went through the API server (unit tests).
type settings struct {
	shards, maxPerUser, stealProbes, replicas int32
	maxInFlight                               int32
	ttl, grace, sweepInterval, reqTimeout     time.Duration
	redisMode                                 string
	postgresKey, admissionKey                 string
}

func resolve(fs *flashsalev1alpha1.FlashSale) settings {
	s := fs.Spec
	d := func(v *metav1.Duration, def string) time.Duration {
		if v != nil {
			return v.Duration
		}
		out, _ := time.ParseDuration(def)
		return out
	}
	r := settings{
		shards:        ptr.Deref(s.Shards, flashsalev1alpha1.DefaultShards),
		maxPerUser:    ptr.Deref(s.MaxPerUser, flashsalev1alpha1.DefaultMaxPerUser),
		stealProbes:   ptr.Deref(s.Reservation.StealProbes, flashsalev1alpha1.DefaultStealProbes),
		replicas:      ptr.Deref(s.Reservation.Replicas, flashsalev1alpha1.DefaultReservationReplicas),
		ttl:           d(s.Reservation.TTL, flashsalev1alpha1.DefaultReservationTTL),
		grace:         d(s.Reservation.GracePeriod, flashsalev1alpha1.DefaultReservationGrace),
		reqTimeout:    d(s.Reservation.RequestTimeout, flashsalev1alpha1.DefaultRequestTimeout),
		maxInFlight:   ptr.Deref(s.Reservation.MaxInFlight, flashsalev1alpha1.DefaultMaxInFlight),
		sweepInterval: d(s.Sweeper.Interval, flashsalev1alpha1.DefaultSweeperInterval),
		redisMode:     string(s.Redis.Mode),
		postgresKey:   s.Postgres.SecretRef.Key,
		admissionKey:  s.Admission.SecretRef.Key,
	}
	if r.redisMode == "" {
		r.redisMode = string(flashsalev1alpha1.DefaultRedisMode)
	}
	if r.postgresKey == "" {
		r.postgresKey = flashsalev1alpha1.DefaultPostgresSecretKey
	}
	if r.admissionKey == "" {
		r.admissionKey = flashsalev1alpha1.DefaultAdmissionSecretKey
	}
	return r
}

// ChildName is the name of a FlashSale's child of the given component.
func ChildName(fs *flashsalev1alpha1.FlashSale, component string) string {
	return fs.Name + "-" + component
}

func childLabels(fs *flashsalev1alpha1.FlashSale, component string) map[string]string {
	return map[string]string{
		LabelName:      "flashsale",
		LabelInstance:  fs.Name,
		LabelComponent: component,
		LabelManagedBy: ManagedBy,
		LabelFlashSale: fs.Name,
	}
}

// campaignEnv is the configuration both data-plane roles read (runtime/config),
// secrets passed by reference, never by value. Only the reserve pods get the
// admission key: the sweeper neither checks tokens nor makes reservations.
func campaignEnv(fs *flashsalev1alpha1.FlashSale, s settings, withAdmissionKey bool) []corev1.EnvVar {
	secret := func(name, secretName, key string, optional bool) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secretName}, Key: key, Optional: ptr.To(optional),
		}}}
	}
	redisSecret := fs.Spec.Redis.SecretRef.Name
	env := []corev1.EnvVar{
		{Name: config.EnvCampaignID, Value: string(fs.UID)},
		{Name: config.EnvNamespace, Value: fs.Namespace},
		{Name: config.EnvName, Value: fs.Name},
		{Name: config.EnvSKU, Value: fs.Spec.SKU},
		{Name: config.EnvShards, Value: strconv.Itoa(int(s.shards))},
		{Name: config.EnvMaxPerUser, Value: strconv.Itoa(int(s.maxPerUser))},
		{Name: config.EnvStealProbes, Value: strconv.Itoa(int(s.stealProbes))},
		{Name: config.EnvTTL, Value: s.ttl.String()},
		{Name: config.EnvGracePeriod, Value: s.grace.String()},
		{Name: config.EnvRedisMode, Value: s.redisMode},
		{Name: config.EnvListen, Value: config.ListenAddr(config.PortHTTP)},
		secret(config.EnvRedisAddresses, redisSecret, SecretKeyRedisAddresses, false),
		secret(config.EnvRedisUsername, redisSecret, SecretKeyRedisUsername, true),
		secret(config.EnvRedisPassword, redisSecret, SecretKeyRedisPassword, true),
		secret(config.EnvPostgresDSN, fs.Spec.Postgres.SecretRef.Name, s.postgresKey, false),
	}
	env = append(env, redisTLSEnv(redisSecret)...)
	if withAdmissionKey {
		env = append(env,
			secret(config.EnvAdmissionKey, fs.Spec.Admission.SecretRef.Name, s.admissionKey, false),
			secret(config.EnvAdmissionKeyPrevious, fs.Spec.Admission.SecretRef.Name, s.admissionKey+AdmissionPreviousSuffix, true),
			secret(config.EnvIDKey, ChildName(fs, ComponentIDs), SecretKeyIDKey, false))
	}
	return env
}

// restricted meets the Pod Security "restricted" profile.
func restrictedContainer() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		RunAsNonRoot:             ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// The startup probe's period, and how long past config.StartupTimeout it
// waits: a process that gave up exits by itself and restarts with back-off.
const (
	startupProbePeriod = 2
	startupProbeSlack  = 10 * time.Second
)

func probe(path string, period int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString(config.PortNameHTTP)}},
		PeriodSeconds: period, TimeoutSeconds: 2, FailureThreshold: 3,
		// Spelled out although it is the API server's default: apply compares
		// the numbers it sets with the live object's.
		SuccessThreshold: 1,
	}
}

func deployment(fs *flashsalev1alpha1.FlashSale, component, image string, replicas int32, c corev1.Container) *appsv1.Deployment {
	labels := childLabels(fs, component)
	c.Name = component
	c.Image = image
	c.Ports = []corev1.ContainerPort{{Name: config.PortNameHTTP, ContainerPort: config.PortHTTP, Protocol: corev1.ProtocolTCP}}
	c.SecurityContext = restrictedContainer()
	// The process listens once it has opened the ledger, which may take up
	// to config.StartupTimeout: liveness (three misses ten seconds apart)
	// would kill it first. The startup probe holds liveness and readiness
	// back until /healthz answers, for a little longer than that.
	c.StartupProbe = probe(config.PathHealthz, startupProbePeriod)
	c.StartupProbe.FailureThreshold = int32((config.StartupTimeout+startupProbeSlack)/time.Second) / startupProbePeriod
	c.LivenessProbe = probe(config.PathHealthz, 10)
	c.ReadinessProbe = probe(config.PathReadyz, 2)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: ChildName(fs, component), Namespace: fs.Namespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{c},
					// Replicas on different nodes where the cluster allows it,
					// so that losing a node does not take the whole component.
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.ScheduleAnyway,
						LabelSelector:  &metav1.LabelSelector{MatchLabels: labels},
						MatchLabelKeys: []string{"pod-template-hash"},
					}},
					// The data plane never talks to the Kubernetes API.
					AutomountServiceAccountToken:  ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To[int64](30),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						RunAsUser:      ptr.To[int64](65532),
						RunAsGroup:     ptr.To[int64](65532),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
				},
			},
		},
	}
	if p := fs.Spec.Pods; p != nil {
		spec := &d.Spec.Template.Spec
		spec.ImagePullSecrets = slices.Clone(p.ImagePullSecrets)
		spec.NodeSelector = maps.Clone(p.NodeSelector)
		spec.Tolerations = slices.Clone(p.Tolerations)
		spec.PriorityClassName = p.PriorityClassName
	}
	d.Annotations = map[string]string{AnnotationPodFields: podFieldsHash(&d.Spec.Template.Spec)}
	return d
}

// ReserveDeployment runs the reservation API of a FlashSale.
func ReserveDeployment(fs *flashsalev1alpha1.FlashSale, image string) *appsv1.Deployment {
	s := resolve(fs)
	env := append(campaignEnv(fs, s, true),
		corev1.EnvVar{Name: config.EnvMetricsListen, Value: config.ListenAddr(config.PortMetrics)},
		corev1.EnvVar{Name: config.EnvDrainDelay, Value: reserveDrainDelay.String()},
		corev1.EnvVar{Name: config.EnvRequestTimeout, Value: s.reqTimeout.String()},
		corev1.EnvVar{Name: config.EnvMaxInFlight, Value: strconv.Itoa(int(s.maxInFlight))},
		// The Go runtime collects harder near the limit instead of the kernel
		// killing the replica at it (no limit: the node's allocatable memory).
		corev1.EnvVar{Name: config.EnvMemoryLimit, ValueFrom: &corev1.EnvVarSource{
			ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1")}}})
	// Requested by default: a pod without requests is the first the kubelet
	// evicts under memory pressure, in the middle of a sale.
	c := corev1.Container{Args: []string{"reserve"}, Env: env, Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU: mustQuantity(DefaultReserveCPURequest), corev1.ResourceMemory: mustQuantity(DefaultReserveMemoryRequest),
	}}}
	if r := fs.Spec.Reservation.Resources; r != nil {
		c.Resources = *r.DeepCopy()
		// As the API server stores them (to the millis, rounded up), so the
		// Deployment compares equal to what was sent.
		roundUpToMillis(c.Resources.Requests)
		roundUpToMillis(c.Resources.Limits)
	}
	// A pod being stopped keeps serving until the Service has stopped routing
	// to it (endpoint removal is asynchronous): without the pause, a rollout
	// refuses the connections still sent its way.
	c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: reservePreStopSeconds}}}
	d := deployment(fs, ComponentReserve, image, s.replicas, c)
	cs := &d.Spec.Template.Spec.Containers[0]
	cs.Ports = append(cs.Ports, corev1.ContainerPort{Name: config.PortNameMetrics, ContainerPort: config.PortMetrics, Protocol: corev1.ProtocolTCP})
	// The metrics listener answers the probes too: on the API's port they
	// would wait for a connection behind the buyers whenever the process
	// holds its buyers' connections at the bound its open-file limit sets.
	for _, p := range []*corev1.Probe{cs.StartupProbe, cs.LivenessProbe, cs.ReadinessProbe} {
		p.HTTPGet.Port = intstr.FromString(config.PortNameMetrics)
	}
	d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To(int64(reservePreStopSeconds + reserveDrainDelay/time.Second + 30))
	return d
}

// DisruptionBudget lets voluntary disruptions (a node drain, a cluster
// upgrade) take one replica of the component at a time, so with two replicas
// or more a drain during the sale never takes the whole reservation API at
// once. An unready pod may be evicted only while the others keep the budget
// (IfHealthyBudget): a crashing replica beside healthy ones does not block a
// drain, but a replica whose probe misses under a sale's load, while another
// is already gone, is not taken too.
func DisruptionBudget(fs *flashsalev1alpha1.FlashSale, component string) *policyv1.PodDisruptionBudget {
	labels := childLabels(fs, component)
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: ChildName(fs, component), Namespace: fs.Namespace, Labels: labels},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr.To(intstr.FromInt32(1)),
			Selector:                   &metav1.LabelSelector{MatchLabels: labels},
			UnhealthyPodEvictionPolicy: ptr.To(policyv1.IfHealthyBudget),
		},
	}
}

func roundUpToMillis(l corev1.ResourceList) {
	for k, q := range l {
		q.RoundUp(resource.Milli)
		l[k] = q
	}
}

// podFieldsHash is AnnotationPodFields's value for a pod template.
func podFieldsHash(p *corev1.PodSpec) string {
	fields := struct {
		ImagePullSecrets  []corev1.LocalObjectReference
		NodeSelector      map[string]string
		Tolerations       []corev1.Toleration
		PriorityClassName string
		Resources         []corev1.ResourceRequirements
	}{p.ImagePullSecrets, p.NodeSelector, p.Tolerations, p.PriorityClassName, nil}
	for _, c := range p.Containers {
		fields.Resources = append(fields.Resources, c.Resources)
	}
	return jsonDigest(fields)
}

// jsonDigest is a short digest of v's JSON (map keys sorted: stable).
func jsonDigest(v any) string {
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// reservePreStopSeconds is the pause before a reserve pod gets SIGTERM, while
// the Service stops routing new connections to it. Then it serves
// reserveDrainDelay more, each answer closing its kept-alive connection so
// buyers reconnect to another replica, and last drains for up to its 25 s
// shutdown timeout, inside the grace period.
const (
	reservePreStopSeconds = 5
	reserveDrainDelay     = 2 * time.Second
)

// ReserveService fronts the reserve replicas.
func ReserveService(fs *flashsalev1alpha1.FlashSale) *corev1.Service {
	labels := childLabels(fs, ComponentReserve)
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: ChildName(fs, ComponentReserve), Namespace: fs.Namespace, Labels: labels},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports: []corev1.ServicePort{{
				Name: config.PortNameHTTP, Port: 80, TargetPort: intstr.FromString(config.PortNameHTTP), Protocol: corev1.ProtocolTCP,
			}},
		},
	}
}

// sweeperReplicas: one sweeps, the other stands by (a PostgreSQL advisory lock
// elects the active one; correctness never depends on it).
const sweeperReplicas = 2

// SweeperDeployment runs the sweeper of a FlashSale.
func SweeperDeployment(fs *flashsalev1alpha1.FlashSale, image string) *appsv1.Deployment {
	s := resolve(fs)
	env := append(campaignEnv(fs, s, false),
		corev1.EnvVar{Name: config.EnvSweepInterval, Value: s.sweepInterval.String()},
		corev1.EnvVar{Name: config.EnvLeaderLock, Value: config.LeaderLockPostgres},
	)
	c := corev1.Container{
		Args: []string{"sweeper"},
		Env:  env,
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: mustQuantity("50m"), corev1.ResourceMemory: mustQuantity("64Mi"),
		}},
	}
	if r := fs.Spec.Sweeper.Resources; r != nil {
		c.Resources = *r.DeepCopy()
		roundUpToMillis(c.Resources.Requests)
		roundUpToMillis(c.Resources.Limits)
	}
	d := deployment(fs, ComponentSweeper, image, sweeperReplicas, c)
	// On SIGTERM a pass in progress finishes (up to 25 s), then the lock is
	// given up (up to 5 s) and the probes' server stops (up to 5 s).
	d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](40)
	return d
}
