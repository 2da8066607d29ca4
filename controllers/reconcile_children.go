package controllers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/failpoint"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// reconcileChildren creates or updates the reserve Deployment and Service and the
// sweeper Deployment, owned by the FlashSale. They are created ahead of the
// schedule's start so the pods are warm before the drop. A child that cannot be
// written (one that exists and is not ours, an admission policy refusing it) is
// reported in Ready and retried soon, and the reconcile goes on: returning the
// error would put the status refresh and the schedule's next edge on the
// controller's growing error backoff.
func (r *FlashSaleReconciler) reconcileChildren(ctx context.Context, s *scope) (bool, error) {
	failed := func(kind, name string, err error) {
		msg := fmt.Sprintf("cannot write %s %s: %v", kind, name, err)
		// One event when it starts failing: the status changes with every
		// refresh during a sale, so repeats would not fold into one.
		if c := meta.FindStatusCondition(s.fs.Status.Conditions, flashsalev1alpha1.ConditionReady); c == nil || c.Reason != ReasonChildrenFailed {
			s.statusEvent(corev1.EventTypeWarning, ReasonChildrenFailed, "%s", msg)
		}
		s.childErr = msg
		s.requeueAfter(retryUnhealthy)
	}
	sweeper := SweeperDeployment(s.fs, r.Image)
	deployments := []*appsv1.Deployment{sweeper}
	idKey, err := r.ensureIDSecret(ctx, s)
	if err != nil {
		// The reserve pods need it: their Deployment is left as it is, so that
		// running pods are not replaced by ones that cannot start.
		failed("Secret", ChildName(s.fs, ComponentIDs), err)
	} else {
		reserve := ReserveDeployment(s.fs, r.Image)
		if idKey != nil && s.refs != nil {
			setPodAnnotation(reserve, AnnotationSecrets, s.refs.podFingerprint(idKey, true))
			setPodAnnotation(sweeper, AnnotationSecrets, s.refs.podFingerprint(idKey, false))
		}
		deployments = append([]*appsv1.Deployment{reserve}, deployments...)
	}
	children := make([]client.Object, 0, len(deployments)+3)
	for _, d := range deployments {
		if s.refs == nil {
			// Without references (a Secret of the spec gone, or changed to
			// values that do not connect) the sale runs on connections opened
			// before, and new pods would not start on the spec's Secrets: a
			// live Deployment only follows the replicas, its pods stay.
			live := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace}}
			switch err := r.readLive(ctx, live); {
			case err == nil:
				live.Spec.Replicas = d.Spec.Replicas
				// Our labels too: one that lost them is outside the cache.
				live.Labels = mergeStrings(live.Labels, d.Labels)
				d = live
			case !apierrors.IsNotFound(err):
				failed("Deployment", d.Name, err)
				continue
			}
		}
		children = append(children, d)
	}
	children = append(children, ReserveService(s.fs),
		DisruptionBudget(s.fs, ComponentReserve), DisruptionBudget(s.fs, ComponentSweeper))
	for _, desired := range children {
		written, err := r.apply(ctx, s.fs, desired)
		if err != nil {
			failed(kindOf(desired), desired.GetName(), err)
		}
		if d, ok := desired.(*appsv1.Deployment); ok && written {
			s.written = append(s.written, d)
		}
	}
	return false, nil
}

// readLive reads the live object of obj's name into obj: from the cache, or
// from the API server for one the cache does not hold (it holds only objects
// with our labels: one that lost them, or is not ours, is not there).
func (r *FlashSaleReconciler) readLive(ctx context.Context, obj client.Object) error {
	err := r.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		err = r.apiReader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	}
	return err
}

// templateStamp is AnnotationTemplateGeneration's value for a pod template
// of that digest written in generation gen: "<generation>/<digest>".
func templateStamp(gen int64, digest string) string {
	return strconv.FormatInt(gen, 10) + "/" + digest
}

// readTemplateStamp is d's AnnotationTemplateGeneration (ok false: none).
func readTemplateStamp(d *appsv1.Deployment) (gen int64, digest string, ok bool) {
	g, digest, _ := strings.Cut(d.Annotations[AnnotationTemplateGeneration], "/")
	gen, err := strconv.ParseInt(g, 10, 64)
	return gen, digest, err == nil
}

func setPodAnnotation(d *appsv1.Deployment, key, value string) {
	setAnnotation(&d.Spec.Template.ObjectMeta, key, value)
}

func setAnnotation(m *metav1.ObjectMeta, key, value string) {
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[key] = value
}

func kindOf(o client.Object) string {
	switch o.(type) {
	case *appsv1.Deployment:
		return "Deployment"
	case *corev1.Service:
		return "Service"
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget"
	}
	return fmt.Sprintf("%T", o)
}

// apply creates the child, or updates it when the desired spec is not already
// contained in the live one (fields the API server defaults are left alone, so an
// unchanged child is never rewritten). It reports whether it wrote the child:
// desired then holds what the API server stored.
func (r *FlashSaleReconciler) apply(ctx context.Context, owner *flashsalev1alpha1.FlashSale, desired client.Object) (bool, error) {
	if err := ctrl.SetControllerReference(owner, desired, r.Scheme()); err != nil {
		return false, err
	}
	hash := jsonDigest(desired)
	live := desired.DeepCopyObject().(client.Object)
	err := r.readLive(ctx, live)
	if apierrors.IsNotFound(err) {
		if d, ok := desired.(*appsv1.Deployment); ok {
			setAnnotation(&d.ObjectMeta, AnnotationTemplateGeneration, templateStamp(1, jsonDigest(d.Spec.Template)))
		}
		err := r.Create(ctx, desired)
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	if !metav1.IsControlledBy(live, owner) {
		return false, fmt.Errorf("it exists and is not owned by FlashSale %s", owner.Name)
	}
	if r.noops.holds(owner, live, hash) {
		return false, nil
	}
	var same bool
	// Labels and annotations others keep on the object (the Deployment
	// controller's revision, a team's labels) stay; ours win.
	desired.SetLabels(mergeStrings(live.GetLabels(), desired.GetLabels()))
	desired.SetAnnotations(mergeStrings(live.GetAnnotations(), desired.GetAnnotations()))
	switch d := desired.(type) {
	case *appsv1.Deployment:
		l := live.(*appsv1.Deployment)
		digest := jsonDigest(d.Spec.Template)
		sameTemplate := equality.Semantic.DeepDerivative(d.Spec.Template, l.Spec.Template) &&
			l.Annotations[AnnotationPodFields] == d.Annotations[AnnotationPodFields] &&
			sameContractEnv(d.Spec.Template.Spec.Containers, l.Spec.Template.Spec.Containers)
		same = sameTemplate && equality.Semantic.DeepDerivative(d.Spec, l.Spec) && equality.Semantic.DeepDerivative(d.Labels, l.Labels)
		if _, was, _ := readTemplateStamp(l); !sameTemplate && was != digest {
			// The update is refused unless it applies to l, and it moves the
			// generation by one. A template stamped already keeps its stamp:
			// admission that rewrites a field of it (an image mirror) would
			// otherwise have every reconcile stamp it anew, and an annotation
			// change moves a Deployment's generation too.
			setAnnotation(&d.ObjectMeta, AnnotationTemplateGeneration, templateStamp(l.Generation+1, digest))
		}
		// Keep the pod labels and annotations others set (a mesh's
		// injection label, a NetworkPolicy's selector label, kubectl
		// rollout restart's annotation): a rewrite without them would roll
		// the pods and the new ones would lose them. Ours (the selector's
		// labels, the secrets fingerprint) win.
		d.Spec.Template.Labels = mergeStrings(l.Spec.Template.Labels, d.Spec.Template.Labels)
		d.Spec.Template.Annotations = mergeStrings(l.Spec.Template.Annotations, d.Spec.Template.Annotations)
	case *corev1.Service:
		l := live.(*corev1.Service)
		same = equality.Semantic.DeepDerivative(d.Spec, l.Spec) && equality.Semantic.DeepDerivative(d.Labels, l.Labels)
		d.Spec.ClusterIP, d.Spec.ClusterIPs = l.Spec.ClusterIP, l.Spec.ClusterIPs
	case *policyv1.PodDisruptionBudget:
		l := live.(*policyv1.PodDisruptionBudget)
		same = equality.Semantic.DeepDerivative(d.Spec, l.Spec) && equality.Semantic.DeepDerivative(d.Labels, l.Labels)
	}
	if same {
		return false, nil
	}
	r.nameReplicasOverride(ctx, owner, desired, live)
	desired.SetResourceVersion(live.GetResourceVersion())
	if err := r.Update(ctx, desired); err != nil {
		return false, err
	}
	r.noops.note(owner, live, desired.GetResourceVersion(), hash)
	return true, nil
}

// noopWrites remembers, per sale, the children whose last Update stored
// nothing: admission (a webhook or policy) replaced a value the operator
// sets, such as the image with a mirror's, so the object stays unlike the
// desired one and each reconcile would send the same Update again, calling
// the webhook every time (and a webhook that fails would make a healthy sale
// ChildrenFailed). Such a child is neither compared nor written again while
// its UID, its content (liveContent: not its status, which its own
// controller writes at every pod change) and the desired object's hash stay
// those of that no-op: a hand edit changes the content and a new spec the
// hash, and either is compared and written as before. One entry per child,
// dropped with its sale (forget).
type noopWrites struct {
	mu    sync.Mutex
	sales map[types.NamespacedName]map[string]noopWrite
}

type noopWrite struct {
	uid           types.UID
	content, hash string
}

func (n *noopWrites) holds(owner *flashsalev1alpha1.FlashSale, live client.Object, hash string) bool {
	n.mu.Lock()
	w, ok := n.sales[client.ObjectKeyFromObject(owner)][kindOf(live)+"/"+live.GetName()]
	n.mu.Unlock()
	return ok && w.uid == live.GetUID() && w.hash == hash && w.content == liveContent(live)
}

// liveContent digests what of a child is not its status: its labels,
// annotations and spec. A kind apply does not know is its resourceVersion.
func liveContent(o client.Object) string {
	var spec any
	switch c := o.(type) {
	case *appsv1.Deployment:
		spec = c.Spec
	case *corev1.Service:
		spec = c.Spec
	case *policyv1.PodDisruptionBudget:
		spec = c.Spec
	default:
		return "rv:" + o.GetResourceVersion()
	}
	return jsonDigest(struct {
		Labels, Annotations map[string]string
		Spec                any
	}{o.GetLabels(), o.GetAnnotations(), spec})
}

// note records an Update of live that came back as resourceVersion.
func (n *noopWrites) note(owner *flashsalev1alpha1.FlashSale, live client.Object, resourceVersion, hash string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sale, child := client.ObjectKeyFromObject(owner), kindOf(live)+"/"+live.GetName()
	if resourceVersion != live.GetResourceVersion() {
		delete(n.sales[sale], child) // written
		return
	}
	if n.sales == nil {
		n.sales = map[types.NamespacedName]map[string]noopWrite{}
	}
	if n.sales[sale] == nil {
		n.sales[sale] = map[string]noopWrite{}
	}
	n.sales[sale][child] = noopWrite{live.GetUID(), liveContent(live), hash}
}

func (n *noopWrites) forget(sale types.NamespacedName) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.sales, sale)
}

// mergeStrings is live's entries overlaid with ours (nil when both are empty).
func mergeStrings(live, ours map[string]string) map[string]string {
	if len(live) == 0 && len(ours) == 0 {
		return nil
	}
	out := maps.Clone(live)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, ours)
	return out
}

// sameContractEnv reports whether every container has exactly the pod
// contract's variables (config.EnvPrefix) desired holds, in order. The spec
// check above takes a live list longer than desired's as defaulted, so a
// FLASHSALE_ variable appended by hand (which overrides the operator's: the
// last of a name wins) would stay. Others' variables may stay, and so may
// containers others add after the operator's (a rewrite would fight the
// webhook that adds them), and failpoint.Env, the test hook that is set on
// a Deployment by hand on purpose (docs/node.md).
func sameContractEnv(desired, live []corev1.Container) bool {
	if len(live) < len(desired) {
		return false
	}
	contract := func(env []corev1.EnvVar) []corev1.EnvVar {
		return slices.DeleteFunc(slices.Clone(env), func(e corev1.EnvVar) bool {
			return !strings.HasPrefix(e.Name, config.EnvPrefix) || e.Name == failpoint.Env
		})
	}
	for i := range desired {
		// Derivative: the API server defaults parts of a variable (a
		// fieldRef's apiVersion); the lengths must match.
		d, l := contract(desired[i].Env), contract(live[i].Env)
		if len(d) != len(l) || !equality.Semantic.DeepDerivative(d, l) {
			return false
		}
	}
	return true
}
