package controllers

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

// Degraded's rules, one table: what computeStatus makes of the reserve and
// sweeper pods' container states, beside Ready.

// replicaPod is a pod of the sale "drop" as the kubelet reports it.
func replicaPod(component, name string, containers ...corev1.ContainerStatus) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop",
		Labels: childLabels(&flashsalev1alpha1.FlashSale{ObjectMeta: metav1.ObjectMeta{Name: "drop"}}, component)}}
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = containers
	return p
}

func ago(d time.Duration) metav1.Time { return metav1.NewTime(statusNow.Add(-d)) }

// running is a container running since ago(since) after restarts, its last
// end last (nil: none).
func running(name string, since time.Duration, restarts int32, last *corev1.ContainerStateTerminated) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Ready: true, RestartCount: restarts,
		State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: ago(since)}},
		LastTerminationState: corev1.ContainerState{Terminated: last}}
}

func backingOff(name string, restarts int32, last *corev1.ContainerStateTerminated) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, RestartCount: restarts,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 20s restarting failed container"}},
		LastTerminationState: corev1.ContainerState{Terminated: last}}
}

func ended(reason string, code int32, finished time.Duration) *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{Reason: reason, ExitCode: code, FinishedAt: ago(finished)}
}

func healthyPods(extra ...corev1.Pod) []corev1.Pod {
	return append([]corev1.Pod{
		replicaPod(ComponentReserve, "drop-reserve-5d8f7-aaaaa", running("reserve", time.Hour, 0, nil)),
		replicaPod(ComponentSweeper, "drop-sweeper-6b9c4-ccccc", running("sweeper", time.Hour, 0, nil)),
	}, extra...)
}

func withPods(pods ...corev1.Pod) facts {
	f := healthy()
	f.replicas = &replicaPods{pods: pods, at: statusNow}
	return f
}

func TestDegradedFromThePods(t *testing.T) {
	oom := ended("OOMKilled", 137, 40*time.Second)
	for _, tc := range []struct {
		name  string
		read  func(*flashsalev1alpha1.FlashSaleStatus)
		facts facts
		conds want
		says  []string // in Degraded's message
	}{
		{name: "every replica running, none restarted", facts: withPods(healthyPods()...),
			conds: want{"Degraded": "False/ReplicasStable", "Ready": "True/Ready"}, says: []string{"in the last 10m"}},
		{name: "one of two reserve replicas OOM-killed again and again, the other serving: Ready stays True",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", 30*time.Second, 3, oom)))...),
			conds: want{"Degraded": "True/OOMKilled", "Ready": "True/Ready"},
			says:  []string{"1 replica crashing: Deployment drop-reserve pod drop-reserve-5d8f7-bbbbb: OOMKilled (exit code 137) at 2026-12-01T08:59:20Z, 3 restarts"}},
		{name: "in back-off after an OOM kill: the kill is the reason",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", backingOff("reserve", 4, oom)))...),
			conds: want{"Degraded": "True/OOMKilled"}, says: []string{"OOMKilled (exit code 137)", "4 restarts, waiting in CrashLoopBackOff"}},
		{name: "in back-off after an error exit",
			facts: withPods(healthyPods(replicaPod(ComponentSweeper, "drop-sweeper-6b9c4-ddddd", backingOff("sweeper", 5, ended("Error", 1, time.Minute))))...),
			conds: want{"Degraded": "True/CrashLoopBackOff", "Ready": "True/Ready"},
			says:  []string{"Deployment drop-sweeper pod drop-sweeper-6b9c4-ddddd: Error (exit code 1)", "waiting in CrashLoopBackOff"}},
		{name: "ended non-zero a moment ago, not yet restarted",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", corev1.ContainerStatus{Name: "reserve",
				State: corev1.ContainerState{Terminated: ended("Error", 2, 5*time.Second)}}))...),
			conds: want{"Degraded": "True/Error"}, says: []string{"Error (exit code 2)", "0 restarts"}},
		{name: "waiting to start again after an error exit",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", corev1.ContainerStatus{Name: "reserve", RestartCount: 1,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
				LastTerminationState: corev1.ContainerState{Terminated: ended("Error", 1, 3*time.Second)}}))...),
			conds: want{"Degraded": "True/Error"}},
		{name: "restarted after an OOM kill, running 11 minutes since: stable again",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb",
				running("reserve", 11*time.Minute, 3, ended("OOMKilled", 137, 11*time.Minute+10*time.Second))))...),
			conds: want{"Degraded": "False/ReplicasStable"}},
		{name: "a clean exit and a restart is no crash",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", time.Minute, 1, ended("Completed", 0, time.Minute))))...),
			conds: want{"Degraded": "False/ReplicasStable"}},
		{name: "a reason the kubelet may give that is not OOMKilled or Error counts by its exit code, cut short",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb",
				running("reserve", time.Minute, 2, ended("ContainerCannotRun"+strings.Repeat("x", 500), 128, time.Minute))))...),
			conds: want{"Degraded": "True/Error"}, says: []string{"ContainerCannotRunxxx", "x… (exit code 128)"}},
		{name: "no reason at all, a non-zero exit",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", time.Minute, 1, ended("", 139, time.Minute))))...),
			conds: want{"Degraded": "True/Error"}, says: []string{"terminated (exit code 139)"}},
		{name: "an end the kubelet did not date counts as long ago",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", corev1.ContainerStatus{Name: "reserve",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}))...),
			conds: want{"Degraded": "False/ReplicasStable"}},
		{name: "a restart whose start is not dated counts as long ago",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", corev1.ContainerStatus{Name: "reserve", RestartCount: 2,
				State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				LastTerminationState: corev1.ContainerState{Terminated: oom}}))...),
			conds: want{"Degraded": "False/ReplicasStable"}},
		{name: "an end dated ahead of the operator's clock (skew) is recent",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", -time.Minute, 1, ended("OOMKilled", 137, -time.Minute))))...),
			conds: want{"Degraded": "True/OOMKilled"}},
		{name: "in back-off with its last end gone from the pod",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", backingOff("reserve", 7, nil)))...),
			conds: want{"Degraded": "True/CrashLoopBackOff"}, says: []string{"last termination not reported, 7 restarts, waiting in CrashLoopBackOff"}},
		{name: "restarted, its last end not reported: not known to be a crash",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", time.Minute, 1, nil)))...),
			conds: want{"Degraded": "False/ReplicasStable"}},
		{name: "a waiting reason other than CrashLoopBackOff is the Deployment's to report",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", corev1.ContainerStatus{Name: "reserve",
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}))...),
			conds: want{"Degraded": "False/ReplicasStable"}},
		{name: "a pod being deleted, and one evicted, do not count", facts: withPods(healthyPods(
			func() corev1.Pod {
				p := replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", time.Minute, 3, oom))
				p.DeletionTimestamp = ptr.To(ago(time.Second))
				return p
			}(),
			func() corev1.Pod {
				p := replicaPod(ComponentReserve, "drop-reserve-5d8f7-eeeee", corev1.ContainerStatus{Name: "reserve",
					State: corev1.ContainerState{Terminated: ended("Error", 137, time.Minute)}})
				p.Status.Phase, p.Status.Reason = corev1.PodFailed, "Evicted"
				return p
			}())...),
			conds: want{"Degraded": "False/ReplicasStable"}},
		{name: "an OOM kill outranks a back-off, which outranks an error exit; replicas named in order",
			facts: withPods(healthyPods(
				replicaPod(ComponentSweeper, "drop-sweeper-6b9c4-ddddd", running("sweeper", time.Minute, 1, ended("Error", 2, time.Minute))),
				replicaPod(ComponentReserve, "drop-reserve-5d8f7-zzzzz", backingOff("reserve", 2, ended("Error", 1, time.Minute))),
				replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", time.Minute, 1, oom)))...),
			conds: want{"Degraded": "True/OOMKilled"},
			says:  []string{"3 replicas crashing: Deployment drop-reserve pod drop-reserve-5d8f7-bbbbb: OOMKilled", "; Deployment drop-reserve pod drop-reserve-5d8f7-zzzzz: Error", "; Deployment drop-sweeper pod drop-sweeper-6b9c4-ddddd: Error"}},
		{name: "a back-off outranks an error exit",
			facts: withPods(healthyPods(
				replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", time.Minute, 1, ended("Error", 2, time.Minute))),
				replicaPod(ComponentSweeper, "drop-sweeper-6b9c4-ddddd", backingOff("sweeper", 2, ended("Error", 1, time.Minute))))...),
			conds: want{"Degraded": "True/CrashLoopBackOff"}},
		{name: "many replicas crashing: the first few named",
			facts: withPods(func() []corev1.Pod {
				var ps []corev1.Pod
				for _, n := range "abcdef" {
					ps = append(ps, replicaPod(ComponentReserve, "drop-reserve-5d8f7-"+string(n), running("reserve", time.Minute, 1, oom)))
				}
				return ps
			}()...),
			conds: want{"Degraded": "True/OOMKilled"}, says: []string{"6 replicas crashing", "pod drop-reserve-5d8f7-d:", "; and 2 more"}},
		{name: "a second container (a sidecar) is named",
			facts: withPods(healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", time.Hour, 0, nil),
				running("proxy", time.Minute, 1, ended("Error", 1, time.Minute))))...),
			conds: want{"Degraded": "True/Error"}, says: []string{"pod drop-reserve-5d8f7-bbbbb container proxy: Error"}},
		{name: "every replica crashing: Ready says the API is down, Degraded why",
			facts: with(withPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", backingOff("reserve", 4, oom))), func(f *facts) {
				f.children = &readiness{reason: ReasonChildrenNotReady, message: "Deployment drop-reserve has 0 of 1 replicas ready"}
			}),
			conds: want{"Degraded": "True/OOMKilled", "Ready": "False/ReservationAPINotReady"}},
		{name: "reported while Redis is down too", facts: stopped(func(f *facts) {
			f.outage = errors.New("dial tcp 127.0.0.1:6379: connection refused")
			f.replicas = &replicaPods{pods: healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", time.Minute, 1, oom))), at: statusNow}
		}), conds: want{"Degraded": "True/OOMKilled", "Ready": "False/RedisUnreachable"}},
		{name: "pods not read: Degraded keeps what it said",
			read: func(st *flashsalev1alpha1.FlashSaleStatus) {
				st.Conditions = append(st.Conditions, metav1.Condition{Type: "Degraded", Status: metav1.ConditionTrue, Reason: ReasonOOMKilled, Message: "before"})
			},
			facts: healthy(), conds: want{"Degraded": "True/OOMKilled"}, says: []string{"before"}},
		{name: "pods not read, nothing said before: nothing said", facts: healthy(), conds: want{"Degraded": "-"}},
		{name: "no pods at all (scaled to 0): nothing crashes", facts: withPods(), conds: want{"Degraded": "False/ReplicasStable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := &flashsalev1alpha1.FlashSale{ObjectMeta: metav1.ObjectMeta{Name: "drop", Namespace: "shop", Generation: statusGen}}
			fs.Status = readStatus()
			if tc.read != nil {
				tc.read(&fs.Status)
			}
			st := computeStatus(fs, &tc.facts, DefaultCountsStamp)
			for typ, w := range tc.conds {
				c := meta.FindStatusCondition(st.Conditions, typ)
				switch {
				case w == "-" && c != nil:
					t.Errorf("%s: %+v, want none", typ, c)
				case w != "-" && (c == nil || string(c.Status)+"/"+c.Reason != w):
					t.Errorf("%s: %+v, want %s", typ, c, w)
				}
			}
			c := meta.FindStatusCondition(st.Conditions, flashsalev1alpha1.ConditionDegraded)
			for _, s := range tc.says {
				if c == nil {
					t.Errorf("no Degraded condition to say %q", s)
				} else if !strings.Contains(c.Message, s) {
					t.Errorf("Degraded's message %q does not say %q", c.Message, s)
				}
			}
			if c != nil && len(c.Message) > eventNoteLimit {
				t.Errorf("Degraded's message is %d bytes: longer than an event takes", len(c.Message))
			}
		})
	}
}

// The verdict does not move while the pods do not: the same pods a minute
// later give the same message (no "ago"), and the condition keeps its
// transition time; it clears at the time crashesChange says, not before.
func TestDegradedIsStableAndClearsOnTime(t *testing.T) {
	pods := healthyPods(replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", 30*time.Second, 3, ended("OOMKilled", 137, 40*time.Second))))
	fs := &flashsalev1alpha1.FlashSale{ObjectMeta: metav1.ObjectMeta{Name: "drop", Namespace: "shop", Generation: statusGen}}
	fs.Status = readStatus()
	at := func(now time.Time) *metav1.Condition {
		f := withPods(pods...)
		f.replicas.at = now
		st := computeStatus(fs, &f, DefaultCountsStamp)
		return meta.FindStatusCondition(st.Conditions, flashsalev1alpha1.ConditionDegraded)
	}
	first := at(statusNow)
	if first == nil {
		t.Fatal("no Degraded condition")
	}
	fs.Status.Conditions = append(fs.Status.Conditions, *first)
	later := at(statusNow.Add(time.Minute))
	if later == nil || later.Message != first.Message || !later.LastTransitionTime.Equal(&first.LastTransitionTime) || later.Status != metav1.ConditionTrue {
		t.Fatalf("a minute later: %+v, first %+v", later, first)
	}
	clears := crashesChange(findCrashes(pods, statusNow))
	if want := statusNow.Add(-30 * time.Second).Add(crashWindow); !clears.Equal(want) {
		t.Fatalf("crashesChange %v, want the restart's start + %s = %v", clears, crashWindow, want)
	}
	if c := at(clears.Add(-time.Second)); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("a second before it clears: %+v", c)
	}
	if c := at(clears); c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonReplicasStable {
		t.Fatalf("when it clears: %+v", c)
	}
	// A back-off has no time of its own: the pod's next change ends it.
	if at := crashesChange(findCrashes(healthyPods(replicaPod(ComponentReserve, "p", backingOff("reserve", 2, nil))), statusNow)); !at.IsZero() {
		t.Fatalf("crashesChange of a back-off: %v", at)
	}
}

// The pod watch queues the pod's sale, only for its own pods, and only on
// the changes Degraded follows.
func TestPodWatchFollowsCrashesOnly(t *testing.T) {
	p := replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", time.Hour, 0, nil))
	if got := salesOfPod(t.Context(), &p); len(got) != 1 || got[0].Namespace != "shop" || got[0].Name != "drop" {
		t.Fatalf("salesOfPod: %v", got)
	}
	foreign := p.DeepCopy()
	foreign.Labels[LabelManagedBy] = "someone-else"
	if got := salesOfPod(t.Context(), foreign); len(got) != 0 {
		t.Fatalf("salesOfPod of a pod not ours: %v", got)
	}
	changed := func(mod func(*corev1.Pod)) bool {
		n := p.DeepCopy()
		mod(n)
		return podCrashChanged.Update(updateEvent(&p, n))
	}
	if changed(func(n *corev1.Pod) { n.Status.ContainerStatuses[0].Ready = false; n.ResourceVersion = "2" }) {
		t.Error("a readiness flip queues a reconcile")
	}
	if !changed(func(n *corev1.Pod) { n.Status.ContainerStatuses[0].RestartCount = 1 }) {
		t.Error("a restart does not queue a reconcile")
	}
	if !changed(func(n *corev1.Pod) { n.Status.ContainerStatuses[0] = backingOff("reserve", 0, nil) }) {
		t.Error("a back-off does not queue a reconcile")
	}
	if !changed(func(n *corev1.Pod) { n.DeletionTimestamp = ptr.To(ago(0)) }) {
		t.Error("a deletion does not queue a reconcile")
	}
}

// The cache keeps of a pod what Degraded reads, not its spec.
func TestPodCacheKeepsTheContainerStates(t *testing.T) {
	p := replicaPod(ComponentReserve, "drop-reserve-5d8f7-bbbbb", running("reserve", time.Minute, 3, ended("OOMKilled", 137, 2*time.Minute)))
	p.Spec.Containers = []corev1.Container{{Name: "reserve", Env: []corev1.EnvVar{{Name: "FLASHSALE_SKU", Value: "itm"}}}}
	p.Annotations = map[string]string{"a": strings.Repeat("x", 1000)}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	p.Status.ContainerStatuses[0].Image = "flashsale-operator:test"
	out, err := podStatusOnly(&p)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Pod)
	if len(got.Spec.Containers) != 0 || len(got.Annotations) != 0 || len(got.Status.Conditions) != 0 || got.Status.ContainerStatuses[0].Image != "" {
		t.Fatalf("kept more than the states: %+v", got)
	}
	if c := findCrashes([]corev1.Pod{*got}, statusNow); len(c) != 1 || c[0].reason != ReasonOOMKilled || c[0].restarts != 3 || c[0].deployment != "drop-reserve" {
		t.Fatalf("the cached pod's crash: %+v", c)
	}
}

func updateEvent(old, new *corev1.Pod) ctrlevent.UpdateEvent {
	return ctrlevent.UpdateEvent{ObjectOld: old, ObjectNew: new}
}
