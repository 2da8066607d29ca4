package controllers

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

// AnnotationOperator names the operator install that manages a sale, as
// the namespace and name of its leader election Lease. Two installs that
// both watch a sale's namespace (an old one left behind, a second release
// of the chart) would otherwise both reconcile it: each writes its own
// image into the sale's Deployments, a rollout at every write, in a loop.
// The first install with a name claims the sale; another leaves it alone
// while it sees the owner's Lease renewed, and takes it over once it has
// seen it unchanged for DefaultOwnerStale (see claim).
const AnnotationOperator = "flashsale.dev/operator"

// DefaultOwnerStale is how long an owner's Lease may go unrenewed before
// another install takes its sales over: long enough that a rolling upgrade
// of the owner (its new pod takes the Lease within seconds) is no handover.
const DefaultOwnerStale = time.Minute

// ownerRecheck is how often an install that leaves a sale to another looks
// again whether the owner is still there.
const ownerRecheck = 30 * time.Second

// claim reports whether this install manages fs, claiming it when no
// install does or its owner is gone. An install without a name (leader
// election off: it has no Lease to be known by) claims nothing, and still
// leaves alone a sale a live install owns. When not, the result says when
// to look again.
func (r *FlashSaleReconciler) claim(ctx context.Context, fs *flashsalev1alpha1.FlashSale) (bool, ctrl.Result, error) {
	owner := fs.Annotations[AnnotationOperator]
	if owner == r.Install {
		return true, ctrl.Result{}, nil
	}
	if owner != "" {
		if live, why := r.ownerLive(ctx, owner); live {
			// Its connections (and a rebuild on them) are the owner's
			// business now.
			r.conns.drop(types.NamespacedName{Namespace: fs.Namespace, Name: fs.Name})
			key := string(fs.UID) + "|" + owner
			if _, told := r.conflictsTold.LoadOrStore(key, true); !told {
				r.recordEvent(ctx, fs, nil, corev1.EventTypeWarning, ReasonOperatorConflict, "Skip",
					fmt.Sprintf("the operator install %s manages this sale (%s); install %s leaves it alone", owner, why, orUnnamed(r.Install)))
			}
			return false, ctrl.Result{RequeueAfter: min(ownerRecheck, r.ownerStale()/2)}, nil
		}
	}
	if r.Install == "" {
		return true, ctrl.Result{}, nil
	}
	before := fs.DeepCopy()
	if fs.Annotations == nil {
		fs.Annotations = map[string]string{}
	}
	fs.Annotations[AnnotationOperator] = r.Install
	if err := r.Patch(ctx, fs, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, ctrl.Result{}, err // a conflict: another install claimed it first, looked at again
	}
	if owner != "" {
		r.recordEvent(ctx, fs, nil, corev1.EventTypeNormal, ReasonOperatorChanged, "Claim",
			fmt.Sprintf("install %s manages this sale now: install %s is gone (its Lease was not renewed for %s, or is gone)", r.Install, owner, r.ownerStale()))
	}
	return true, ctrl.Result{}, nil
}

func orUnnamed(install string) string { return cmp.Or(install, "(unnamed: no leader election)") }

// leaseSeen is a Lease's renew time as this install last saw it change,
// and when, by this install's clock: a Lease is stale once it has not
// changed for ownerStale as this install counts, whatever the owner's clock
// says (as client-go's leader election judges a Lease).
type leaseSeen struct {
	renewed string
	at      time.Time
}

// ownerLive tells whether the install owner (its Lease's namespace/name)
// renewed its Lease within ownerStale, and says how it knows. A Lease that
// cannot be read (no permission across namespaces) is taken for live: a
// handover that may be wrong is the loop the annotation is there to stop.
func (r *FlashSaleReconciler) ownerLive(ctx context.Context, owner string) (bool, string) {
	ns, name, ok := strings.Cut(owner, "/")
	if !ok || ns == "" || name == "" {
		return false, "it has no Lease"
	}
	lease := &coordinationv1.Lease{}
	err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, lease)
	switch {
	case apierrors.IsNotFound(err):
		return false, "its Lease is gone"
	case err != nil:
		return true, fmt.Sprintf("its Lease cannot be read: %v", err)
	}
	renewed := ""
	if t := cmp.Or(lease.Spec.RenewTime, lease.Spec.AcquireTime); t != nil {
		renewed = t.UTC().Format(time.RFC3339Nano)
	}
	now := r.now()
	seen := leaseSeen{renewed: renewed, at: now}
	if v, ok := r.leasesSeen.Load(owner); ok && v.(leaseSeen).renewed == renewed {
		seen = v.(leaseSeen)
	} else {
		r.leasesSeen.Store(owner, seen)
	}
	if still := now.Sub(seen.at); still > r.ownerStale() {
		return false, fmt.Sprintf("its Lease has not been renewed for %s", still.Round(time.Second))
	}
	return true, "its Lease is renewed"
}

func (r *FlashSaleReconciler) ownerStale() time.Duration {
	if r.OwnerStale > 0 {
		return r.OwnerStale
	}
	return DefaultOwnerStale
}
