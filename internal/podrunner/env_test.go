package podrunner

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "a", "EMPTY": "", "B": "$(A)"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for in, want := range map[string]string{
		"plain":           "plain",
		"$(A)":            "a",
		"x$(A)y$(A)":      "xaya",
		"$(EMPTY)|":       "|",
		"$(B)":            "$(A)", // values are not expanded twice
		"$(MISSING)":      "$(MISSING)",
		"$$(A)":           "$(A)",
		"$$":              "$",
		"$A":              "$A",
		"$(A":             "$(A",
		"$()":             "$()",
		"trailing $":      "trailing $",
		"a $$$(A) $(A)$$": "a $a a$",
	} {
		if got := expand(in, lookup); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCommandLine(t *testing.T) {
	env := []corev1.EnvVar{{Name: "ROLE", Value: "reserve"}, {Name: "ROLE", Value: "sweeper"}}
	for _, tc := range []struct {
		name          string
		command, args []string
		want          []string
		err           string
	}{
		{name: "args only", args: []string{"reserve"}, want: []string{"/bin/fs", "reserve"}},
		{name: "entrypoint", command: []string{"/flashsale", "manager"}, args: []string{"--x"}, want: []string{"/bin/fs", "manager", "--x"}},
		{name: "entrypoint by name", command: []string{"flashsale"}, args: []string{"$(ROLE)"}, want: []string{"/bin/fs", "sweeper"}},
		{name: "other program", command: []string{"/bin/sh", "-c", "true"}, err: "only the image's entrypoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := commandLine("/bin/fs", "/flashsale", &corev1.Container{Command: tc.command, Args: tc.args}, env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("commandLine = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestEnviron(t *testing.T) {
	got := environ([]string{"PATH=/bin", "HOSTNAME=x"}, []corev1.EnvVar{{Name: "A", Value: "1=2"}, {Name: "PATH", Value: "/usr/bin"}})
	want := []string{"HOSTNAME=x", "A=1=2", "PATH=/usr/bin"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("environ = %q, want %q", got, want)
	}
}

func TestContainerEnv(t *testing.T) {
	cs := fake.NewClientset(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Data: map[string][]byte{"k": []byte("secret"), "X": []byte("from-secret")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"k": "config", "Y": "from-cm"}},
	)
	r := resolver{cs: cs}
	pod := podMeta{Namespace: "ns", Name: "p-0", UID: "u", Labels: map[string]string{"app": "x"}}
	ref := func(name string, src corev1.EnvVarSource) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &src}
	}
	secret := func(name, key string, optional bool) *corev1.SecretKeySelector {
		return &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: ptr.To(optional)}
	}
	cm := func(name, key string, optional bool) *corev1.ConfigMapKeySelector {
		return &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: ptr.To(optional)}
	}
	res := func(name, resource, divisor string) corev1.EnvVar {
		sel := &corev1.ResourceFieldSelector{Resource: resource}
		if divisor != "" {
			sel.Divisor = apiresource.MustParse(divisor)
		}
		return ref(name, corev1.EnvVarSource{ResourceFieldRef: sel})
	}
	c := &corev1.Container{
		Name: "reserve",
		Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceMemory: apiresource.MustParse("256Mi")},
			Requests: corev1.ResourceList{corev1.ResourceCPU: apiresource.MustParse("250m")},
		},
		EnvFrom: []corev1.EnvFromSource{
			{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}, Prefix: "S_"},
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}},
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: ptr.To(true)}},
		},
		Env: []corev1.EnvVar{
			{Name: "Y", Value: "overridden-$(k)"},
			ref("SECRET", corev1.EnvVarSource{SecretKeyRef: secret("s", "k", false)}),
			ref("CONFIG", corev1.EnvVarSource{ConfigMapKeyRef: cm("cm", "k", false)}),
			ref("NO_SECRET", corev1.EnvVarSource{SecretKeyRef: secret("absent", "k", true)}),
			ref("NO_KEY", corev1.EnvVarSource{ConfigMapKeyRef: cm("cm", "absent", true)}),
			ref("NAME", corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}),
			ref("APP", corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}),
			ref("IP", corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}),
			res("MEM", "limits.memory", "1"),
			res("MEM_MI", "limits.memory", "1Mi"),
			res("MEM_REQ", "requests.memory", ""), // no request: the limit
			res("CPU_REQ_M", "requests.cpu", "1m"),
			res("CPU_REQ", "requests.cpu", ""), // a quarter core, rounded up
			res("CPU_LIM", "limits.cpu", ""),   // no limit: the host's cores
			{Name: "USES", Value: "$(SECRET)/$(NAME)/$(LATER)"},
			{Name: "LATER", Value: "later"},
		},
	}
	env, err := r.containerEnv(context.Background(), c, pod)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range env {
		got[e.Name] = e.Value
	}
	want := map[string]string{
		"S_k": "secret", "S_X": "from-secret", "k": "config", "Y": "overridden-config",
		"SECRET": "secret", "CONFIG": "config", "NAME": "p-0", "APP": "x", "IP": "127.0.0.1",
		"USES": "secret/p-0/$(LATER)", "LATER": "later",
		"MEM": "268435456", "MEM_MI": "256", "MEM_REQ": "268435456", "CPU_REQ_M": "250", "CPU_REQ": "1",
		"CPU_LIM": strconv.Itoa(runtime.NumCPU()),
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("env = %v\nwant  %v", got, want)
	}

	for name, e := range map[string]corev1.EnvVar{
		`secret "absent"`:            ref("A", corev1.EnvVarSource{SecretKeyRef: secret("absent", "k", false)}),
		`has no key "nope"`:          ref("A", corev1.EnvVarSource{SecretKeyRef: secret("s", "nope", false)}),
		`configmap "absent"`:         ref("A", corev1.EnvVarSource{ConfigMapKeyRef: cm("absent", "k", false)}),
		`"spec.schedulerName"`:       ref("A", corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.schedulerName"}}),
		`"limits.ephemeral-storage"`: res("A", "limits.ephemeral-storage", ""),
		`container "sidecar"`:        ref("A", corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "sidecar", Resource: "limits.memory"}}),
	} {
		_, err := r.containerEnv(context.Background(), &corev1.Container{Env: []corev1.EnvVar{e}}, pod)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("resolving %+v: error %v, want one containing %s", e.ValueFrom, err, name)
		}
	}
}

// A container that names one Secret for many variables reads it once per
// start: many replicas starting at once must not spend the client's rate
// limit on copies of the same read.
func TestContainerEnvReadsEachSecretOnce(t *testing.T) {
	cs := fake.NewClientset(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Data: map[string][]byte{"a": []byte("1"), "b": []byte("2"), "c": []byte("3")}},
	)
	r := resolver{cs: cs}
	key := func(name, secret, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key, Optional: ptr.To(true)}}}
	}
	c := &corev1.Container{
		EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}, Prefix: "S_"}},
		Env:     []corev1.EnvVar{key("A", "s", "a"), key("B", "s", "b"), key("C", "s", "c"), key("X", "absent", "x"), key("Y", "absent", "y")},
	}
	env, err := r.containerEnv(context.Background(), c, podMeta{Namespace: "ns", Name: "p-0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(env) != 6 {
		t.Fatalf("env = %v, want S_a, S_b, S_c, A, B and C", env)
	}
	reads := map[string]int{}
	for _, a := range cs.Actions() {
		if g, ok := a.(k8stesting.GetAction); ok && a.GetResource().Resource == "secrets" {
			reads[g.GetName()]++
		}
	}
	if want := map[string]int{"s": 1, "absent": 1}; !reflect.DeepEqual(reads, want) {
		t.Fatalf("Secret reads %v, want %v", reads, want)
	}
}

// A container without a memory limit is given this host's memory, as the
// kubelet gives the node's allocatable.
func TestResourceValueWithoutALimitIsTheHosts(t *testing.T) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	var kb int64
	if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err != nil || kb <= 0 {
		t.Fatalf("/proc/meminfo starts %q: %v", b[:min(len(b), 40)], err)
	}
	got, err := resourceValue(&corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: apiresource.MustParse("1Ki")}, &corev1.Container{})
	if err != nil || got != strconv.FormatInt(kb, 10) {
		t.Fatalf("limits.memory without a limit, in KiB: %q, %v; want %d", got, err, kb)
	}
}
