package podrunner

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func secretRef(name, secret, key string, optional bool) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key, Optional: ptr.To(optional),
	}}}
}

func TestReplicasRunWithTheResolvedEnvironment(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	if _, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		StringData: map[string]string{"dsn": "postgres://u@127.0.0.1:5432/db", "user": "alice"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"mode": "standalone"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := create(t, newDeployment(ns, "api", 2,
		withArgs("reserve", "--flag=$(PLAIN)", "$$(PLAIN)"),
		withEnv(
			corev1.EnvVar{Name: "PLAIN", Value: "plain"},
			corev1.EnvVar{Name: "EXPANDED", Value: "x-$(PLAIN)-$(UNDEFINED)"},
			secretRef("DSN", "db", "dsn", false),
			secretRef("OPTIONAL_NO_SECRET", "absent", "k", true),
			secretRef("OPTIONAL_NO_KEY", "db", "absent", true),
			corev1.EnvVar{Name: "MODE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "mode",
			}}},
			corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			corev1.EnvVar{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			corev1.EnvVar{Name: DefaultAsideListenEnv, Value: ":9090"},
		)))

	got := waitStatus(t, ns, "api", 2)
	if c := condition(got, appsv1.DeploymentAvailable); c == nil || c.Status != corev1.ConditionTrue {
		t.Errorf("Available condition = %+v, want True", c)
	}
	if got.Status.ObservedGeneration != d.Generation {
		t.Errorf("observedGeneration %d, want %d", got.Status.ObservedGeneration, d.Generation)
	}

	ps := pods(ns, "api")
	if len(ps) != 2 {
		t.Fatalf("runner reports %d replicas, want 2: %+v", len(ps), ps)
	}
	addrs := map[string]bool{}
	for i, p := range ps {
		if p.Index != i || !p.Ready || p.Phase != PhaseRunning || p.PID == 0 || p.Restarts != 0 {
			t.Errorf("replica %d: %+v", i, p)
		}
		addrs[p.Address] = true
		var e fakeEnv
		getJSON(t, "http://"+p.Address+"/env", &e)
		if e.PID != p.PID {
			t.Errorf("%s: process pid %d, runner says %d", p.Name, e.PID, p.PID)
		}
		want := map[string]string{
			"PLAIN": "plain", "EXPANDED": "x-plain-$(UNDEFINED)", "DSN": "postgres://u@127.0.0.1:5432/db",
			"MODE": "standalone", "POD_NAME": p.Name, "POD_NAMESPACE": ns, "HOSTNAME": p.Name,
			DefaultListenEnv: p.Address,
		}
		for k, v := range want {
			if e.Env[k] != v {
				t.Errorf("%s: %s=%q, want %q", p.Name, k, e.Env[k], v)
			}
		}
		// The further listen address: a loopback port of its own.
		aside := e.Env[DefaultAsideListenEnv]
		if host, port, err := net.SplitHostPort(aside); err != nil || host != "127.0.0.1" || port == "9090" || aside == p.Address {
			t.Errorf("%s: %s=%q, want a 127.0.0.1 port of its own", p.Name, DefaultAsideListenEnv, aside)
		}
		addrs[aside] = true
		for _, k := range []string{"OPTIONAL_NO_SECRET", "OPTIONAL_NO_KEY", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} {
			if v, ok := e.Env[k]; ok {
				t.Errorf("%s: %s=%q is set, want it absent", p.Name, k, v)
			}
		}
		if want := []string{"reserve", "--flag=plain", "$(PLAIN)"}; strings.Join(e.Args, " ") != strings.Join(want, " ") {
			t.Errorf("%s: args %q, want %q", p.Name, e.Args, want)
		}
		if want, _ := filepath.EvalSymlinks(filepath.Join(runner.cfg.Dir, "pods", ns, p.Name)); e.WD != want {
			t.Errorf("%s: working directory %s, want %s", p.Name, e.WD, want)
		}
	}
	if len(addrs) != 4 {
		t.Errorf("replicas share an address: %v", addrs)
	}
}

// Probes may name the port of a further listen address (the reserve pods
// probe their metrics port): the runner maps it onto that address's own
// loopback port, as it maps the listening port. The API port answers unready
// here, so only probes sent to the metrics port make the replicas ready.
func TestProbesReachAFurtherListenAddress(t *testing.T) {
	ns := namespace(t)
	create(t, newDeployment(ns, "aside", 2, withEnv(
		corev1.EnvVar{Name: DefaultAsideListenEnv, Value: ":9090"},
		corev1.EnvVar{Name: "FAKEPOD_API_UNREADY", Value: "1"},
	), func(d *appsv1.Deployment) {
		c := &d.Spec.Template.Spec.Containers[0]
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: "metrics", ContainerPort: 9090})
		c.ReadinessProbe.HTTPGet.Port = intstr.FromString("metrics")
		c.LivenessProbe.HTTPGet.Port = intstr.FromInt32(9090)
	}))
	waitStatus(t, ns, "aside", 2)
	for _, p := range pods(ns, "aside") {
		resp, err := http.Get("http://" + p.Address + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s: the API port's /readyz answers %d: the test's premise is gone", p.Name, resp.StatusCode)
		}
		if p.Restarts != 0 {
			t.Errorf("%s restarted %d times: its liveness probe missed the metrics port", p.Name, p.Restarts)
		}
	}
}

func condition(d *appsv1.Deployment, typ appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == typ {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

func TestMissingSecretIsReportedUntilItExists(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	create(t, newDeployment(ns, "api", 1, withEnv(secretRef("KEY", "late", "key", false))))
	eventually(t, 20*time.Second, func() string {
		d := getDeployment(t, ns, "api")
		c := condition(d, appsv1.DeploymentReplicaFailure)
		if c == nil || c.Status != corev1.ConditionTrue || !strings.Contains(c.Message, `secret "late"`) {
			return fmt.Sprintf("ReplicaFailure condition %+v, want one naming the missing secret", c)
		}
		if d.Status.ReadyReplicas != 0 {
			return "a replica is ready without its secret"
		}
		return ""
	})
	if ps := pods(ns, "api"); len(ps) != 1 || ps[0].PID != 0 || ps[0].Phase != PhaseWaiting {
		t.Fatalf("replica without its secret: %+v, want Waiting and no process", ps)
	}
	if _, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "late"}, StringData: map[string]string{"key": "v1"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := waitStatus(t, ns, "api", 1)
	if c := condition(d, appsv1.DeploymentReplicaFailure); c != nil {
		t.Errorf("ReplicaFailure still reported: %+v", c)
	}
	var e fakeEnv
	getJSON(t, "http://"+pods(ns, "api")[0].Address+"/env", &e)
	if e.Env["KEY"] != "v1" {
		t.Fatalf("KEY=%q, want v1", e.Env["KEY"])
	}
}

func TestCrashedReplicaIsRestarted(t *testing.T) {
	ns := namespace(t)
	create(t, newDeployment(ns, "api", 2))
	waitStatus(t, ns, "api", 2)
	before := pods(ns, "api")

	// A crash from inside: the process exits with an error.
	post(t, "http://"+before[0].Address+"/exit?code=3")
	// A crash from outside: SIGKILL through the chaos API.
	pid, err := runner.Kill(ns, "api", 1)
	if err != nil {
		t.Fatal(err)
	}
	if pid != before[1].PID {
		t.Fatalf("Kill returned pid %d, want %d", pid, before[1].PID)
	}
	eventually(t, 10*time.Second, func() string {
		if d := getDeployment(t, ns, "api"); d.Status.ReadyReplicas == 2 {
			return "ready replicas still 2 after both crashed"
		}
		return ""
	})
	d := waitStatus(t, ns, "api", 2)
	after := pods(ns, "api")
	for i, p := range after {
		if p.Name != before[i].Name || p.PID == before[i].PID || p.Restarts != 1 || !p.Ready {
			t.Errorf("replica %d after its crash: %+v (before: pid %d)", i, p, before[i].PID)
		}
		if alive(before[i].PID) {
			t.Errorf("old pid %d still alive", before[i].PID)
		}
	}
	if !strings.Contains(after[0].LastExit, "exit code 3") || !strings.Contains(after[1].LastExit, "killed") {
		t.Errorf("last exits %q and %q, want exit code 3 and killed", after[0].LastExit, after[1].LastExit)
	}
	if d.Status.AvailableReplicas != 2 {
		t.Errorf("status %+v", d.Status)
	}
	if _, err := runner.Kill(ns, "api", 2); err == nil {
		t.Error("Kill of index 2 of 2 replicas succeeded")
	}
}

func TestScaleDownThenDeleteStopsProcesses(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	create(t, newDeployment(ns, "api", 3))
	waitStatus(t, ns, "api", 3)
	before := pods(ns, "api")

	d := getDeployment(t, ns, "api")
	d.Spec.Replicas = ptr.To[int32](2)
	if _, err := kube.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ns, "api", 2)
	eventually(t, 10*time.Second, func() string {
		if alive(before[2].PID) {
			return fmt.Sprintf("the highest replica (pid %d) still runs after the scale down", before[2].PID)
		}
		return ""
	})
	after := pods(ns, "api")
	for i, p := range after {
		if p.PID != before[i].PID {
			t.Errorf("replica %d was replaced by the scale down: pid %d, was %d", i, p.PID, before[i].PID)
		}
	}

	if err := kube.AppsV1().Deployments(ns).Delete(ctx, "api", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string {
		for _, p := range after {
			if alive(p.PID) {
				return fmt.Sprintf("pid %d of the deleted deployment still runs", p.PID)
			}
		}
		for _, p := range runner.State().Pods {
			if p.Namespace == ns {
				return fmt.Sprintf("runner still lists %s", p.Name)
			}
		}
		return ""
	})
}

func TestTerminationGracePeriodEndsWithSIGKILL(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	create(t, newDeployment(ns, "stubborn", 1, withGrace(1), withEnv(corev1.EnvVar{Name: "FAKEPOD_IGNORE_TERM", Value: "1"})))
	waitStatus(t, ns, "stubborn", 1)
	p := pods(ns, "stubborn")[0]
	start := time.Now()
	if err := kube.AppsV1().Deployments(ns).Delete(ctx, "stubborn", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string {
		if alive(p.PID) {
			return fmt.Sprintf("pid %d still alive", p.PID)
		}
		return ""
	})
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Fatalf("a process that ignores SIGTERM was gone after %v, before its 1s grace period", took)
	}
}

func TestTemplateChangeReplacesReplicasWhileStayingReady(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	create(t, newDeployment(ns, "api", 2, withEnv(corev1.EnvVar{Name: "VERSION", Value: "1"})))
	waitStatus(t, ns, "api", 2)
	before := pods(ns, "api")

	// Watch the ready count while the new template rolls out.
	stop := make(chan struct{})
	minReady := make(chan int32, 1)
	go func() {
		lowest := int32(2)
		for {
			select {
			case <-stop:
				minReady <- lowest
				return
			case <-time.After(20 * time.Millisecond):
			}
			if d, err := kube.AppsV1().Deployments(ns).Get(ctx, "api", metav1.GetOptions{}); err == nil {
				lowest = min(lowest, d.Status.ReadyReplicas)
			}
		}
	}()
	d := getDeployment(t, ns, "api")
	d.Spec.Template.Spec.Containers[0].Env[1].Value = "2"
	// New replicas need a moment to become ready, so that a rollout that stops
	// the old ones first would be seen.
	d.Spec.Template.Spec.Containers[0].Env = append(d.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "FAKEPOD_READY_AFTER", Value: "600ms"})
	if _, err := kube.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ns, "api", 2)
	close(stop)
	if lowest := <-minReady; lowest < 2 {
		t.Errorf("ready replicas fell to %d during the rollout, want never below 2", lowest)
	}
	for _, p := range pods(ns, "api") {
		var e fakeEnv
		getJSON(t, "http://"+p.Address+"/env", &e)
		if e.Env["VERSION"] != "2" {
			t.Errorf("%s runs VERSION=%q after the rollout", p.Name, e.Env["VERSION"])
		}
	}
	for _, p := range before {
		if alive(p.PID) {
			t.Errorf("replica %s (pid %d) of the old template still runs", p.Name, p.PID)
		}
	}
}

func TestServiceReachesOnlyReadyReplicas(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	create(t, newDeployment(ns, "api", 2, withProbe(1, 1)))
	create(t, newDeployment(ns, "other", 1, withLabel("app.kubernetes.io/component", "other")))
	sel := map[string]string{"app": "api"}
	if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Labels: map[string]string{"app.kubernetes.io/managed-by": "flashsale-operator"}},
		Spec: corev1.ServiceSpec{Selector: sel, Ports: []corev1.ServicePort{{
			Name: "http", Port: 80, TargetPort: intstr.FromString("http"),
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ns, "api", 2)
	waitStatus(t, ns, "other", 1)
	var url string
	eventually(t, 10*time.Second, func() string {
		st := runner.State()
		var ok bool
		if url, ok = st.ServiceURL(ns, "api", 80); !ok {
			return "service api not exposed"
		}
		for _, s := range st.Services {
			if s.Namespace == ns && len(s.Endpoints) != 2 {
				return fmt.Sprintf("service endpoints %v, want 2", s.Endpoints)
			}
		}
		return ""
	})
	ps := pods(ns, "api")
	seen := whoami(t, url, 6)
	if len(seen) != 2 || seen[ps[0].Name] != 3 || seen[ps[1].Name] != 3 {
		t.Fatalf("6 connections reached %v, want 3 on each of %s and %s", seen, ps[0].Name, ps[1].Name)
	}

	// A replica that fails its readiness probe gets no new connections.
	post(t, "http://"+ps[0].Address+"/unready")
	eventually(t, 10*time.Second, func() string {
		if d := getDeployment(t, ns, "api"); d.Status.ReadyReplicas != 1 {
			return fmt.Sprintf("ready replicas %d, want 1", d.Status.ReadyReplicas)
		}
		return ""
	})
	if seen := whoami(t, url, 4); seen[ps[1].Name] != 4 {
		t.Fatalf("with %s unready, 4 connections reached %v", ps[0].Name, seen)
	}
}

// whoami makes n requests, each on a new connection, and counts the replicas
// that answered.
func whoami(t *testing.T, url string, n int) map[string]int {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	seen := map[string]int{}
	for range n {
		resp, err := client.Get(url + "/whoami")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		name, _, _ := strings.Cut(string(b), " ")
		seen[name]++
	}
	return seen
}
