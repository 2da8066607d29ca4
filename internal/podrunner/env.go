package podrunner

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
		v, ok, err := r.valueFrom(ctx, e, pod, secrets)
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
func (r resolver) valueFrom(ctx context.Context, e corev1.EnvVar, pod podMeta, secrets *secretReads) (string, bool, error) {
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
	}
	return "", false, fmt.Errorf("env %s: only secretKeyRef, configMapKeyRef and fieldRef are supported here", e.Name)
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
