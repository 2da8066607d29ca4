package podrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// Shared by the package's integration tests: one API server, one runner. Each
// test works in its own namespace.
var (
	kube   kubernetes.Interface
	runner *Runner
	logBuf *testharness.SyncBuffer
)

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := testharness.RunDir("podrunner")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bin := filepath.Join(dir, "fakepod")
		if out, err := exec.Command("go", "build", "-o", bin, "./testdata/fakepod").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building fakepod: %v\n%s", err, out)
			return 1
		}
		k, err := testharness.StartKube()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() { _ = k.Stop() }()
		kube = kubernetes.NewForConfigOrDie(k.Config)
		logBuf = &testharness.SyncBuffer{}
		runner, err = New(Config{
			Kube: k.Config, Binary: bin, Dir: filepath.Join(dir, "runner"),
			MaxGrace: 5 * time.Second, BackoffInitial: 200 * time.Millisecond, BackoffMax: time.Second,
			StateFile: filepath.Join(dir, "state.json"),
			Log:       slog.New(slog.NewTextHandler(logBuf, nil)),
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- runner.Run(ctx) }()
		code := m.Run()
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "runner:", err)
			code = 1
		}
		if left := runner.State().Pods; len(left) > 0 {
			fmt.Fprintln(os.Stderr, "replicas left after Run returned:", left)
			code = 1
		}
		if code != 0 {
			fmt.Fprintln(os.Stderr, "--- runner log ---\n"+logBuf.String())
		}
		return code
	}()
	os.Exit(code)
}

var nsSeq atomic.Int32

// namespace creates a namespace for one test.
func namespace(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%s", nsSeq.Add(1), strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.TrimRight(name, "-")
	_, err := kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// deploymentOption changes a test Deployment.
type deploymentOption func(*appsv1.Deployment)

func withEnv(env ...corev1.EnvVar) deploymentOption {
	return func(d *appsv1.Deployment) {
		c := &d.Spec.Template.Spec.Containers[0]
		c.Env = append(c.Env, env...)
	}
}

func withArgs(args ...string) deploymentOption {
	return func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Args = args }
}

func withProbe(period, failures int32) deploymentOption {
	return func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].ReadinessProbe.PeriodSeconds = period
		d.Spec.Template.Spec.Containers[0].ReadinessProbe.FailureThreshold = failures
	}
}

func withGrace(seconds int64) deploymentOption {
	return func(d *appsv1.Deployment) { d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To(seconds) }
}

func withLabel(k, v string) deploymentOption {
	return func(d *appsv1.Deployment) {
		d.Labels[k] = v
		d.Spec.Template.Labels[k] = v
	}
}

// newDeployment is a Deployment shaped like the operator's children: one container
// listening on FLASHSALE_LISTEN=:8080 (port "http"), readiness on /readyz.
func newDeployment(ns, name string, replicas int32, opts ...deploymentOption) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/managed-by": "flashsale-operator", "app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "main", Image: "flashsale-operator:test", Args: []string{"reserve"},
					Env:            []corev1.EnvVar{{Name: DefaultListenEnv, Value: ":8080"}},
					Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http")}}, PeriodSeconds: 1},
					LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}, PeriodSeconds: 5},
				}}},
			},
		},
	}
	for k, v := range labels {
		d.Labels[k] = v
		d.Spec.Template.Labels[k] = v
	}
	for _, o := range opts {
		o(d)
	}
	return d
}

func create(t *testing.T, d *appsv1.Deployment) *appsv1.Deployment {
	t.Helper()
	out, err := kube.AppsV1().Deployments(d.Namespace).Create(context.Background(), d, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func getDeployment(t *testing.T, ns, name string) *appsv1.Deployment {
	t.Helper()
	d, err := kube.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// eventually polls cond until it returns "" or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s\nstate: %s", timeout, msg, mustJSON(runner.State()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func mustJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// waitStatus waits until the Deployment's status reports want ready,
// available and updated replicas out of want, for its current generation.
func waitStatus(t *testing.T, ns, name string, want int32) *appsv1.Deployment {
	t.Helper()
	var d *appsv1.Deployment
	eventually(t, 30*time.Second, func() string {
		d = getDeployment(t, ns, name)
		s := d.Status
		if s.ObservedGeneration != d.Generation || s.Replicas != want || s.ReadyReplicas != want || s.AvailableReplicas != want || s.UpdatedReplicas != want {
			return fmt.Sprintf("deployment %s status %+v, want %d replicas ready for generation %d", name, s, want, d.Generation)
		}
		return ""
	})
	return d
}

func pods(ns, name string) []Pod { return runner.State().PodsOf(ns, name) }

// fakeEnv is what a fakepod replica reports about itself.
type fakeEnv struct {
	Args []string          `json:"args"`
	Env  map[string]string `json:"env"`
	PID  int               `json:"pid"`
	WD   string            `json:"wd"`
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, b)
	}
}

func post(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url, "text/plain", nil)
	if err == nil {
		resp.Body.Close()
	}
}

// alive tells whether a pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}
