package controllers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

// CacheOptions is what the manager keeps in memory, cluster-wide or in the
// given namespaces. The operator must not grow with the cluster:
//   - Deployments, Services and PodDisruptionBudgets: only the sales' own
//     (ours carry the managed-by label);
//   - Pods: only the sales' own (their templates carry the label), and of
//     each only its name, labels and containers' states (podStatusOnly);
//   - Secrets: metadata only, for the watch that tells when a referenced one
//     changes; their data is read from the API server (secretReader), so the
//     cluster's other Secrets (Helm releases, certificates) are never held;
//   - managed fields of nothing.
//
// Reads of a kind without an informer fail instead of silently starting a
// cluster-wide one.
func CacheOptions(namespaces []string) cache.Options {
	ours := labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy})
	opts := cache.Options{
		DefaultTransform:            cache.TransformStripManagedFields(),
		ReaderFailOnMissingInformer: true,
		ByObject: map[client.Object]cache.ByObject{
			&appsv1.Deployment{}:            {Label: ours},
			&corev1.Service{}:               {Label: ours},
			&policyv1.PodDisruptionBudget{}: {Label: ours},
			&corev1.Pod{}:                   {Label: ours, Transform: podStatusOnly},
			&corev1.Secret{}:                {Transform: secretMetadataOnly},
		},
	}
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = make(map[string]cache.Config, len(namespaces))
		for _, n := range namespaces {
			opts.DefaultNamespaces[n] = cache.Config{}
		}
	}
	return opts
}

// ClientOptions makes the manager's client read Secrets from the API server:
// the cache holds their metadata only.
func ClientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}}
}

// secretMetadataOnly keeps what the Secret watch and secretReader use (name,
// namespace, resourceVersion) and drops the rest: a Secret applied with kubectl
// carries its whole data again in an annotation.
func secretMetadataOnly(o any) (any, error) {
	if m, ok := o.(metav1.Object); ok {
		m.SetManagedFields(nil)
		m.SetAnnotations(nil)
		m.SetLabels(nil)
	}
	return o, nil
}

// secretReader reads Secrets through the metadata cache: a Secret's data is
// fetched from the API server only when its resourceVersion is new to it, so a
// refresh every few seconds costs no request while nothing changes.
type secretReader struct {
	meta client.Reader // the manager's cache (metadata informer for Secrets)
	api  client.Reader // the API server
	now  func() time.Time

	mu     sync.Mutex
	seen   map[types.NamespacedName]*seenSecret
	pruned time.Time
}

type seenSecret struct {
	secret *corev1.Secret
	used   time.Time
}

// secretUnusedFor is how long a Secret no reconcile reads stays held (a sale
// deleted, a secretRef renamed): longer than an idle sale's refresh.
const secretUnusedFor = 3 * idleRefresh

func newSecretReader(meta, api client.Reader) *secretReader {
	return &secretReader{meta: meta, api: api, now: time.Now, seen: map[types.NamespacedName]*seenSecret{}}
}

// Get reads the Secret at the version the cache shows, or a later one. What the
// cache does not show is asked of the API server: a Secret just created (the
// sale's own id key), or a cache behind; NotFound is the API server's answer.
func (r *secretReader) Get(ctx context.Context, key types.NamespacedName, out *corev1.Secret) error {
	var m metav1.PartialObjectMetadata
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	err := r.meta.Get(ctx, key, &m)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	now := r.now()
	r.mu.Lock()
	r.prune(now)
	s, ok := r.seen[key]
	if ok && err == nil && s.secret.ResourceVersion == m.ResourceVersion {
		s.used = now
		s.secret.DeepCopyInto(out)
		r.mu.Unlock()
		return nil
	}
	r.mu.Unlock()
	var fresh corev1.Secret
	if err := r.api.Get(ctx, key, &fresh); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(key)
		}
		return err
	}
	r.mu.Lock()
	r.seen[key] = &seenSecret{secret: fresh.DeepCopy(), used: now}
	r.mu.Unlock()
	fresh.DeepCopyInto(out)
	return nil
}

// prune drops the Secrets no reconcile has read for secretUnusedFor; at most
// once a minute. Called with mu held.
func (r *secretReader) prune(now time.Time) {
	if now.Sub(r.pruned) < time.Minute {
		return
	}
	r.pruned = now
	for k, s := range r.seen {
		if now.Sub(s.used) > secretUnusedFor {
			delete(r.seen, k)
		}
	}
}

// forget drops what is held for these Secrets (a sale deleted, a Secret gone).
func (r *secretReader) forget(keys ...types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		delete(r.seen, k)
	}
}

// held reports how many Secrets' data is held (for tests).
func (r *secretReader) held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// watchedKinds are the kinds CacheOptions keeps, as lists for a reading of
// their metadata.
var watchedKinds = []schema.GroupVersionKind{
	flashsalev1alpha1.GroupVersion.WithKind("FlashSaleList"),
	appsv1.SchemeGroupVersion.WithKind("DeploymentList"),
	corev1.SchemeGroupVersion.WithKind("ServiceList"),
	policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudgetList"),
	corev1.SchemeGroupVersion.WithKind("PodList"),
	corev1.SchemeGroupVersion.WithKind("SecretList"),
}

// ReadableNamespaces is the namespaces of namespaces in which the manager may
// list every kind its cache watches, and for each other one the kind it may
// not. An install scoped to namespaces (the chart's watchNamespaces) reads
// them through a Role in each, which a namespace's deletion removes: the
// cache of a namespace it may not read never syncs, and the manager would
// stop at its start, leaving the sales of every other namespace unmanaged.
// Any other error than a refusal is returned.
func ReadableNamespaces(ctx context.Context, c client.Reader, namespaces []string) (readable []string, refused map[string]string, err error) {
	refused = map[string]string{}
	for _, ns := range namespaces {
		for _, gvk := range watchedKinds {
			list := &metav1.PartialObjectMetadataList{}
			list.SetGroupVersionKind(gvk)
			err := c.List(ctx, list, client.InNamespace(ns), client.Limit(1))
			if apierrors.IsForbidden(err) {
				refused[ns] = strings.TrimSuffix(gvk.Kind, "List")
				break
			}
			if err != nil {
				return nil, nil, fmt.Errorf("listing %s in namespace %s: %w", strings.TrimSuffix(gvk.Kind, "List"), ns, err)
			}
		}
		if _, ok := refused[ns]; !ok {
			readable = append(readable, ns)
		}
	}
	return readable, refused, nil
}
