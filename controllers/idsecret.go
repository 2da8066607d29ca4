package controllers

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

// idKeyBytes is the size of a sale's reservation id key.
const idKeyBytes = 32

// ensureIDSecret makes sure the sale's <name>-ids Secret exists before the
// reserve pods that read it. Reservation ids are keyed by it, so that
// rotating the admission key during the sale does not change what a retried
// request with the same idempotency key replays. It is written once and never
// rewritten: a new key would change the ids mid-sale.
//
// A new sale gets a random key. A sale whose reserve Deployment already runs
// without one (created by an earlier version of the operator) gets the key its
// pods derive from the admission key, so its ids stay the same. It returns the
// key when it knows it (nil when another create won the race).
// A Secret deleted
// while the reserve pods read it is not recreated: a new key would split the
// replicas' ids, and the old one is only in the running pods.
func (r *FlashSaleReconciler) ensureIDSecret(ctx context.Context, s *scope) ([]byte, error) {
	name := types.NamespacedName{Namespace: s.fs.Namespace, Name: ChildName(s.fs, ComponentIDs)}
	var live corev1.Secret
	err := r.secrets.Get(ctx, name, &live)
	switch {
	case err == nil:
		if !metav1.IsControlledBy(&live, s.fs) {
			return nil, fmt.Errorf("it exists and is not owned by FlashSale %s", s.fs.Name)
		}
		k, err := base64.RawURLEncoding.DecodeString(string(live.Data[SecretKeyIDKey]))
		if err != nil || len(k) < 16 {
			return nil, fmt.Errorf("its key %q is not at least 16 bytes in unpadded base64url", SecretKeyIDKey)
		}
		return k, nil
	case !apierrors.IsNotFound(err):
		return nil, err
	}
	key, err := r.newIDKey(ctx, s)
	if err != nil {
		return nil, err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name.Name, Namespace: name.Namespace, Labels: childLabels(s.fs, ComponentIDs)},
		Type:       corev1.SecretTypeOpaque,
		Immutable:  ptr.To(true),
		// Text: the reserve pods read it from an environment variable.
		Data: map[string][]byte{SecretKeyIDKey: []byte(base64.RawURLEncoding.EncodeToString(key))},
	}
	if err := ctrl.SetControllerReference(s.fs, secret, r.Scheme()); err != nil {
		return nil, err
	}
	switch err := r.Create(ctx, secret); {
	case apierrors.IsAlreadyExists(err):
		return nil, nil // created meanwhile; the next reconcile reads it
	case err != nil:
		return nil, err
	}
	return key, nil
}

func (r *FlashSaleReconciler) newIDKey(ctx context.Context, s *scope) ([]byte, error) {
	var d appsv1.Deployment
	// From the API server: the cache misses a Deployment that lost its
	// labels, and minting a key for pods that hold another would split the ids.
	err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: s.fs.Namespace, Name: ChildName(s.fs, ComponentReserve)}, &d)
	switch {
	case apierrors.IsNotFound(err):
		key := make([]byte, idKeyBytes)
		_, err := rand.Read(key)
		return key, err
	case err != nil:
		return nil, err
	case readsIDKey(&d):
		return nil, fmt.Errorf("it was deleted while the reserve pods read it: restore it with the key they hold, or the replicas will disagree on reservation ids")
	case s.refs == nil:
		return nil, fmt.Errorf("the admission Secret is needed to keep the ids of the running reserve pods")
	}
	return config.DeriveIDSecret(s.refs.admissionKey), nil
}

// readsIDKey reports whether the Deployment's pods read FLASHSALE_ID_KEY.
func readsIDKey(d *appsv1.Deployment) bool {
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == config.EnvIDKey {
				return true
			}
		}
	}
	return false
}
