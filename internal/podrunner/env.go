package podrunner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// podIP is every replica's address: all replicas share the host's loopback.
const podIP = "127.0.0.1"

// podMeta is what the downward API (fieldRef) can say about a replica.
type podMeta struct {
	Namespace, Name, UID string
	Labels, Annotations  map[string]string
	ServiceAccount       string
}

// resolver reads the Secrets and ConfigMaps a container refers to, at the moment
// the process starts, as the kubelet does.
type resolver struct {
	cs kubernetes.Interface
}

// containerEnv builds a container's environment in the kubelet's order: envFrom
// sources, then env entries (later ones win), each value expanded with $(VAR)
// against the variables defined before it. It never adds variables the kubelet
// would add for Services (KUBERNETES_SERVICE_HOST and friends): there is no
// in-cluster API endpoint here, and the data plane must not look for one.
func (r resolver) containerEnv(ctx context.Context, c *corev1.Container, pod podMeta) ([]corev1.EnvVar, error) {
	// Each Secret is read once per start: a container names the same Secret
	// for many variables, and a read per variable spends the client's rate
	// limit on copies when many replicas start at once.
	secrets := &secretReads{cs: r.cs, ns: pod.Namespace, got: map[string]secretRead{}}
	var out []corev1.EnvVar
	set := map[string]int{} // name -> index in out
	put := func(name, value string) {
		if i, ok := set[name]; ok {
			out[i].Value = value
			return
		}
		set[name] = len(out)
		out = append(out, corev1.EnvVar{Name: name, Value: value})
	}
	for _, from := range c.EnvFrom {
		data, err := r.envFromSource(ctx, pod.Namespace, from, secrets)
		if err != nil {
			return nil, err
		}
		for _, k := range sortedKeys(data) {
			put(from.Prefix+k, data[k])
		}
	}
	for _, e := range c.Env {
		lookup := func(name string) (string, bool) {
			if i, ok := set[name]; ok {
				return out[i].Value, true
			}
			return "", false
		}
		if e.ValueFrom == nil {
			put(e.Name, expand(e.Value, lookup))
			continue
		}
		v, ok, err := r.valueFrom(ctx, e, c, pod, secrets)
		if err != nil {
			return nil, err
		}
		if ok {
			put(e.Name, v)
		}
	}
	return out, nil
}

func (r resolver) envFromSource(ctx context.Context, ns string, from corev1.EnvFromSource, secrets *secretReads) (map[string]string, error) {
	switch {
	case from.SecretRef != nil:
		s, err := secrets.get(ctx, from.SecretRef.Name)
		if apierrors.IsNotFound(err) && optional(from.SecretRef.Optional) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("envFrom secret %q: %w", from.SecretRef.Name, err)
		}
		data := map[string]string{}
		for k, v := range s.Data {
			data[k] = string(v)
		}
		for k, v := range s.StringData { // never stored, but harmless
			data[k] = v
		}
		return data, nil
	case from.ConfigMapRef != nil:
		cm, err := r.cs.CoreV1().ConfigMaps(ns).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional(from.ConfigMapRef.Optional) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("envFrom configmap %q: %w", from.ConfigMapRef.Name, err)
		}
		return cm.Data, nil
	}
	return nil, nil
}

// valueFrom resolves one env entry's valueFrom. ok is false when an optional
// reference is missing: the variable is then not set at all, as in Kubernetes.
func (r resolver) valueFrom(ctx context.Context, e corev1.EnvVar, c *corev1.Container, pod podMeta, secrets *secretReads) (string, bool, error) {
	src := e.ValueFrom
	switch {
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := secrets.get(ctx, ref.Name)
		if apierrors.IsNotFound(err) && optional(ref.Optional) {
			return "", false, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("env %s: secret %q: %w", e.Name, ref.Name, err)
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("env %s: secret %q has no key %q", e.Name, ref.Name, ref.Key)
		}
		return string(v), true, nil
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := r.cs.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional(ref.Optional) {
			return "", false, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("env %s: configmap %q: %w", e.Name, ref.Name, err)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("env %s: configmap %q has no key %q", e.Name, ref.Name, ref.Key)
		}
		return v, true, nil
	case src.FieldRef != nil:
		v, err := fieldValue(src.FieldRef.FieldPath, pod)
		if err != nil {
			return "", false, fmt.Errorf("env %s: %w", e.Name, err)
		}
		return v, true, nil
	case src.ResourceFieldRef != nil:
		v, err := resourceValue(src.ResourceFieldRef, c)
		if err != nil {
			return "", false, fmt.Errorf("env %s: %w", e.Name, err)
		}
		return v, true, nil
	}
	return "", false, fmt.Errorf("env %s: only secretKeyRef, configMapKeyRef, fieldRef and resourceFieldRef are supported here", e.Name)
}

// resourceValue is the downward API for a container's own resources, as
// the kubelet gives it: the quantity divided by the divisor (1 when unset),
// rounded up; a limit the container does not set is this host's capacity
// (the node's allocatable), a request it does not set its limit, else 0.
func resourceValue(ref *corev1.ResourceFieldSelector, c *corev1.Container) (string, error) {
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		return "", fmt.Errorf("resourceFieldRef of container %q: only the container's own resources are supported here", ref.ContainerName)
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") || (name != "cpu" && name != "memory") {
		return "", fmt.Errorf("resourceFieldRef %q: only limits and requests of cpu and memory are supported here", ref.Resource)
	}
	rn := corev1.ResourceName(name)
	q, set := c.Resources.Limits[rn]
	if kind == "requests" {
		if r, ok := c.Resources.Requests[rn]; ok {
			q, set = r, true
		}
	}
	if !set {
		if kind == "requests" {
			q = resource.Quantity{}
		} else {
			var err error
			if q, err = hostCapacity(rn); err != nil {
				return "", fmt.Errorf("resourceFieldRef %q: %w", ref.Resource, err)
			}
		}
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	if rn == corev1.ResourceCPU {
		return strconv.FormatInt(ceilDiv(q.MilliValue(), div.MilliValue()), 10), nil
	}
	return strconv.FormatInt(ceilDiv(q.Value(), div.Value()), 10), nil
}

func ceilDiv(a, b int64) int64 {
	if b <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// hostCapacity is what a container without a limit may use here: the
// host's cores, or its memory (MemTotal).
func hostCapacity(rn corev1.ResourceName) (resource.Quantity, error) {
	if rn == corev1.ResourceCPU {
		return *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI), nil
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return resource.Quantity{}, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			if f := strings.Fields(rest); len(f) == 2 && f[1] == "kB" {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil && kb > 0 {
					return *resource.NewQuantity(kb<<10, resource.BinarySI), nil
				}
			}
		}
	}
	return resource.Quantity{}, errors.New("no MemTotal in /proc/meminfo")
}

// secretReads are the Secrets one start has read, by name, with the error
// of the read (a Secret not found is remembered too).
type secretReads struct {
	cs  kubernetes.Interface
	ns  string
	got map[string]secretRead
}

type secretRead struct {
	secret *corev1.Secret
	err    error
}

func (c *secretReads) get(ctx context.Context, name string) (*corev1.Secret, error) {
	if r, ok := c.got[name]; ok {
		return r.secret, r.err
	}
	s, err := c.cs.CoreV1().Secrets(c.ns).Get(ctx, name, metav1.GetOptions{})
	c.got[name] = secretRead{secret: s, err: err}
	return s, err
}

// fieldValue is the downward API for the fields that mean something here.
func fieldValue(path string, pod podMeta) (string, error) {
	switch path {
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.name":
		return pod.Name, nil
	case "metadata.uid":
		return pod.UID, nil
	case "spec.serviceAccountName":
		return pod.ServiceAccount, nil
	case "spec.nodeName":
		return "localhost", nil
	case "status.podIP", "status.podIPs", "status.hostIP", "status.hostIPs":
		return podIP, nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if rest, ok := strings.CutPrefix(path, prefix+"['"); ok {
			if key, ok := strings.CutSuffix(rest, "']"); ok {
				return m[key], nil
			}
		}
	}
	return "", fmt.Errorf("fieldRef %q is not supported by the local pod runner", path)
}

func optional(p *bool) bool { return p != nil && *p }

// expand replaces $(VAR) with the value of VAR when it is defined and leaves the
// reference as it is otherwise; $$ is a literal $. These are Kubernetes' rules for
// env values, command and args.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok && name != "" {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}
