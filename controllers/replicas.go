package controllers

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

// crashWindow is how long a container's failed end keeps its replica
// reported in Degraded. It is the kubelet's own span: a container that has
// run this long has its restart back-off (at most 5 minutes) reset, so a
// replica in a crash loop stays reported between its restarts, and one that
// ran this long since is stable again.
const crashWindow = 10 * time.Minute

// The kubelet's words in a container's state.
const (
	waitingCrashLoop = "CrashLoopBackOff"
	terminatedOOM    = "OOMKilled"
)

// listedCrashes bounds the replicas a Degraded message names; kubelet
// reasons are cut to kubeletReasonLimit bytes.
const (
	listedCrashes      = 4
	kubeletReasonLimit = 64
)

// replicaPods are the sale's reserve and sweeper pods, as the manager's
// cache held them at a time of the controller's clock.
type replicaPods struct {
	pods []corev1.Pod
	at   time.Time
}

// readReplicaPods lists the pods of the sale's reserve and sweeper
// Deployments (their selectors' labels) from the manager's cache.
func (r *FlashSaleReconciler) readReplicaPods(ctx context.Context, fs *flashsalev1alpha1.FlashSale) (*replicaPods, error) {
	var out []corev1.Pod
	for _, component := range []string{ComponentReserve, ComponentSweeper} {
		var list corev1.PodList
		if err := r.List(ctx, &list, client.InNamespace(fs.Namespace), client.MatchingLabels(childLabels(fs, component))); err != nil {
			return nil, err
		}
		out = append(out, list.Items...)
	}
	return &replicaPods{pods: out, at: r.now()}, nil
}

// crash is one container found crashing.
type crash struct {
	component, deployment, pod, container string
	// reason is Degraded's: ReasonOOMKilled, ReasonCrashLoopBackOff or
	// ReasonError.
	reason string
	// ended is the termination the kubelet reports (nil: none reported, a
	// container in back-off whose last state is gone).
	ended    *corev1.ContainerStateTerminated
	restarts int32
	backOff  bool
	// until is when it stops counting unless the pod changes (zero: only a
	// change of the pod ends it, a back-off).
	until time.Time
}

// findCrashes applies Degraded's rule to the pods' container states at now.
// A pod being deleted, or Failed or Succeeded (evicted: the ReplicaSet
// replaces it, its containers never restart), is left out.
func findCrashes(pods []corev1.Pod, now time.Time) []crash {
	var out []crash
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		for _, cs := range p.Status.ContainerStatuses {
			if c, ok := containerCrash(cs, now); ok {
				c.component, c.pod, c.container = p.Labels[LabelComponent], p.Name, cs.Name
				// The Deployment's name, as ChildName gives it.
				c.deployment = p.Labels[LabelFlashSale] + "-" + c.component
				out = append(out, c)
			}
		}
	}
	slices.SortFunc(out, func(a, b crash) int {
		return cmp.Or(cmp.Compare(a.component, b.component), cmp.Compare(a.pod, b.pod), cmp.Compare(a.container, b.container))
	})
	return out
}

// containerCrash: the container waits in CrashLoopBackOff, or ended in
// failure (an OOM kill, a non-zero exit) less than crashWindow ago: it is
// ended now, or waits to start again, or runs again since less than
// crashWindow. A time the kubelet did not report counts as long ago: a
// report that cannot be dated must not keep the condition True for good.
func containerCrash(cs corev1.ContainerStatus, now time.Time) (crash, bool) {
	recent := func(t metav1.Time) (time.Time, bool) {
		until := t.Add(crashWindow)
		return until, !t.IsZero() && now.Before(until)
	}
	c := crash{restarts: cs.RestartCount, ended: cs.LastTerminationState.Terminated}
	switch st := cs.State; {
	case st.Waiting != nil && st.Waiting.Reason == waitingCrashLoop:
		c.backOff = true
	case st.Terminated != nil:
		c.ended = st.Terminated
		until, ok := recent(st.Terminated.FinishedAt)
		if !failed(c.ended) || !ok {
			return crash{}, false
		}
		c.until = until
	case st.Running != nil:
		// Restarted after a failure, and running since less than crashWindow.
		until, ok := recent(st.Running.StartedAt)
		if cs.RestartCount == 0 || !failed(c.ended) || !ok {
			return crash{}, false
		}
		c.until = until
	default:
		// Waiting to start again (ContainerCreating after an end) or not
		// reported: as recent as its last end.
		if !failed(c.ended) {
			return crash{}, false
		}
		until, ok := recent(c.ended.FinishedAt)
		if !ok {
			return crash{}, false
		}
		c.until = until
	}
	switch {
	case c.ended != nil && c.ended.Reason == terminatedOOM:
		c.reason = ReasonOOMKilled
	case c.backOff:
		c.reason = ReasonCrashLoopBackOff
	default:
		c.reason = ReasonError
	}
	return c, true
}

// failed: the kernel killed the container at its memory limit, or it
// exited non-zero (a crash, a liveness probe's kill). A clean exit is not a
// crash, though a loop of them shows as CrashLoopBackOff.
func failed(t *corev1.ContainerStateTerminated) bool {
	return t != nil && (t.Reason == terminatedOOM || t.ExitCode != 0)
}

// degradedVerdict is Degraded's status, reason and message for crashes.
func degradedVerdict(crashes []crash) (metav1.ConditionStatus, string, string) {
	if len(crashes) == 0 {
		return metav1.ConditionFalse, ReasonReplicasStable,
			fmt.Sprintf("no reserve or sweeper replica crashed in the last %s", shortDuration(crashWindow))
	}
	// The most telling reason: an OOM kill says what to change.
	reason := ReasonError
	for _, c := range crashes {
		if c.reason == ReasonOOMKilled || (c.reason == ReasonCrashLoopBackOff && reason == ReasonError) {
			reason = c.reason
		}
	}
	var b strings.Builder
	if len(crashes) == 1 {
		b.WriteString("1 replica crashing: ")
	} else {
		fmt.Fprintf(&b, "%d replicas crashing: ", len(crashes))
	}
	for i, c := range crashes {
		if i == listedCrashes {
			fmt.Fprintf(&b, "; and %d more", len(crashes)-listedCrashes)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(describeCrash(c))
	}
	return metav1.ConditionTrue, reason, b.String()
}

// describeCrash names the Deployment and the pod and says what the kubelet
// reports, with absolute times only: the message must not change from one
// refresh to the next while the pods do not.
func describeCrash(c crash) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Deployment %s pod %s", c.deployment, c.pod)
	if c.container != c.component {
		fmt.Fprintf(&b, " container %s", c.container)
	}
	b.WriteString(": ")
	if t := c.ended; t != nil {
		why := t.Reason
		if why == "" {
			why = "terminated"
		}
		fmt.Fprintf(&b, "%s (exit code %d)", truncate(why, kubeletReasonLimit), t.ExitCode)
		if !t.FinishedAt.IsZero() {
			fmt.Fprintf(&b, " at %s", t.FinishedAt.UTC().Format(time.RFC3339))
		}
	} else {
		b.WriteString("last termination not reported")
	}
	fmt.Fprintf(&b, ", %d restart", c.restarts)
	if c.restarts != 1 {
		b.WriteString("s")
	}
	if c.backOff {
		b.WriteString(", waiting in CrashLoopBackOff")
	}
	return b.String()
}

// crashesChange is the earliest time at which a crash found stops counting
// while its pod does not change (zero: none will; a pod's change queues a
// reconcile itself).
func crashesChange(crashes []crash) time.Time {
	var at time.Time
	for _, c := range crashes {
		if !c.until.IsZero() && (at.IsZero() || c.until.Before(at)) {
			at = c.until
		}
	}
	return at
}

// shortDuration is d without its zero units ("10m", not "10m0s").
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// salesOfPod maps a reserve or sweeper pod to its sale.
func salesOfPod(_ context.Context, o client.Object) []reconcile.Request {
	l := o.GetLabels()
	if l[LabelManagedBy] != ManagedBy || l[LabelFlashSale] == "" || (l[LabelComponent] != ComponentReserve && l[LabelComponent] != ComponentSweeper) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: l[LabelFlashSale]}}}
}

// podCrashChanged passes the pod changes Degraded may follow: a restart, a
// container entering or leaving a waiting or ended state, a pod deleted.
// Readiness flips and the like are the Deployments' to report.
var podCrashChanged = predicate.Funcs{
	CreateFunc:  func(ctrlevent.CreateEvent) bool { return false },
	GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
	DeleteFunc:  func(ctrlevent.DeleteEvent) bool { return true },
	UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Pod)
		n, ok2 := e.ObjectNew.(*corev1.Pod)
		if !ok1 || !ok2 {
			return true
		}
		return o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() || o.Status.Phase != n.Status.Phase ||
			!slices.Equal(crashKeys(o), crashKeys(n))
	},
}

// crashKeys sums up what podCrashChanged compares of each container.
func crashKeys(p *corev1.Pod) []string {
	out := make([]string, 0, len(p.Status.ContainerStatuses))
	for _, cs := range p.Status.ContainerStatuses {
		state := "running"
		switch {
		case cs.State.Waiting != nil:
			state = "waiting:" + cs.State.Waiting.Reason
		case cs.State.Terminated != nil:
			state = "terminated:" + cs.State.Terminated.Reason
		case cs.State.Running == nil:
			state = "unknown"
		}
		out = append(out, fmt.Sprintf("%s/%d/%s", cs.Name, cs.RestartCount, state))
	}
	return out
}

// podStatusOnly keeps of a cached pod what Degraded reads: its name,
// labels, deletion and phase, and its containers' states and restart counts.
// The spec (the environment, the probes) and the rest of the status are
// dropped, so the cache holds a few hundred bytes per pod.
func podStatusOnly(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp, CreationTimestamp: p.CreationTimestamp,
		},
		Status: corev1.PodStatus{Phase: p.Status.Phase},
	}
	for _, cs := range p.Status.ContainerStatuses {
		out.Status.ContainerStatuses = append(out.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: cs.Name, State: cs.State, LastTerminationState: cs.LastTerminationState, Ready: cs.Ready, RestartCount: cs.RestartCount,
		})
	}
	return out, nil
}

// nameReplicasOverride warns, before the operator puts a Deployment's
// replicas back from the spec, when the live ones were set by another
// writer: an autoscaler or kubectl scale aimed at the Deployment fights the
// operator, and each would undo the other in silence. The other writer is
// the manager of spec.replicas in the Deployment's managedFields when it is
// not the manager of spec.selector, which only the operator sets (at create).
// The cache keeps no managedFields, so they are read from the API server,
// only when the replicas differ.
func (r *FlashSaleReconciler) nameReplicasOverride(ctx context.Context, owner *flashsalev1alpha1.FlashSale, desired, live client.Object) {
	d, ok := desired.(*appsv1.Deployment)
	l, _ := live.(*appsv1.Deployment)
	if !ok || l == nil || d.Spec.Replicas == nil || l.Spec.Replicas == nil || *d.Spec.Replicas == *l.Spec.Replicas {
		return
	}
	l = &appsv1.Deployment{}
	if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(live), l); err != nil ||
		l.UID != live.GetUID() || l.Spec.Replicas == nil || *l.Spec.Replicas == *d.Spec.Replicas {
		return
	}
	who := replicasWriter(l)
	if who == "" {
		return
	}
	advice := fmt.Sprintf("scale the FlashSale instead (kubectl scale flashsale/%s, or an autoscaler whose scaleTargetRef is the FlashSale)", owner.Name)
	if d.Labels[LabelComponent] != ComponentReserve {
		advice = "the sweeper's replicas are fixed: one sweeps, the other stands by"
	}
	// The Deployment is the related object: events of one reason and action
	// are a series per (regarding, related), which keeps the first note.
	r.recordEvent(ctx, owner, l, corev1.EventTypeWarning, ReasonReplicasOverridden, "Scale",
		fmt.Sprintf("%s set Deployment %s to %d replicas; the operator puts back %d: %s",
			who, l.Name, *l.Spec.Replicas, *d.Spec.Replicas, advice))
}

// replicasWriter is the manager that set d's spec.replicas when it is not
// the one that set its selector, with the subresource it wrote through;
// "" when they are the same or the fields do not say.
func replicasWriter(d *appsv1.Deployment) string {
	var ours, theirs, via string
	for _, mf := range d.ManagedFields {
		if mf.FieldsV1 == nil {
			continue
		}
		var fields struct {
			Spec map[string]json.RawMessage `json:"f:spec"`
		}
		if json.Unmarshal(mf.FieldsV1.GetRawBytes(), &fields) != nil {
			continue
		}
		if _, ok := fields.Spec["f:selector"]; ok {
			ours = mf.Manager
		}
		if _, ok := fields.Spec["f:replicas"]; ok {
			theirs, via = mf.Manager, mf.Subresource
		}
	}
	if ours == "" || theirs == "" || theirs == ours {
		return ""
	}
	if via != "" {
		return fmt.Sprintf("%s (through the %s subresource)", theirs, via)
	}
	return theirs
}
