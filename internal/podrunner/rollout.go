package podrunner

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
)

// reconcile brings the replicas of one Deployment toward its spec: scale up and
// down, and replace replicas of an older template one at a time, never with
// fewer ready replicas than asked for while the new ones are not ready.
func (r *Runner) reconcile(st *deployment) {
	d := st.obj
	if st.failure = unsupported(&d.Spec.Template); st.failure != "" {
		r.retireAll(st)
		return
	}
	desired := 1
	if d.Spec.Replicas != nil {
		desired = int(*d.Spec.Replicas)
	}
	hash := templateHash(&d.Spec.Template)
	var cur, old []*replica
	for _, rp := range st.replicas {
		if rp.hash == hash {
			cur = append(cur, rp)
		} else {
			old = append(old, rp)
		}
	}
	ready := func(rp *replica) bool { return rp.snapshot().ready }
	// Old replicas that are not ready serve nothing: replace them at once.
	for _, rp := range old {
		if !ready(rp) {
			r.retire(st, rp)
		}
	}
	old = slices.DeleteFunc(old, func(rp *replica) bool { return rp.stopping() })
	// Scale down: not-ready replicas first, then the highest slots.
	if len(cur) > desired {
		slices.SortStableFunc(cur, func(a, b *replica) int {
			ra, rb := ready(a), ready(b)
			if ra != rb {
				if ra {
					return 1
				}
				return -1
			}
			return b.slot - a.slot
		})
		for _, rp := range cur[:len(cur)-desired] {
			r.retire(st, rp)
		}
		cur = cur[len(cur)-desired:]
	}
	const surge = 1
	for len(cur) < desired && len(cur)+len(old) < desired+surge {
		cur = append(cur, r.newReplica(st, hash))
	}
	readyCur, readyOld := 0, 0
	for _, rp := range cur {
		if ready(rp) {
			readyCur++
		}
	}
	readyOld = len(old) // only ready ones are left
	for _, rp := range old {
		if readyCur+readyOld-1 < desired {
			break
		}
		r.retire(st, rp)
		readyOld--
	}
}

// newReplica starts a replica in the lowest free slot.
func (r *Runner) newReplica(st *deployment, hash string) *replica {
	d := st.obj
	used := map[string]bool{}
	for _, rp := range st.replicas {
		used[rp.name] = true
	}
	for _, rp := range r.retired {
		if rp.namespace == st.namespace {
			used[rp.name] = true
		}
	}
	slot, name := 0, ""
	for ; ; slot++ {
		name = fmt.Sprintf("%s-%s-%d", d.Name, hash, slot)
		if !used[name] {
			break
		}
	}
	tmpl := d.Spec.Template.DeepCopy()
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	tmpl.Labels[podTemplateHashLabel] = hash
	grace := r.cfg.MaxGrace
	if g := tmpl.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = min(grace, time.Duration(*g)*time.Second)
	}
	rp := &replica{
		r: r, namespace: st.namespace, deployment: st.name, slot: slot, name: name,
		uid: string(uuid.NewUUID()), hash: hash, template: tmpl, grace: grace,
		logPath: filepath.Join(r.cfg.Dir, "logs", st.namespace, name+".log"),
		dir:     filepath.Join(r.cfg.Dir, "pods", st.namespace, name),
		stopCh:  make(chan struct{}), done: make(chan struct{}), phase: PhasePending,
	}
	st.replicas = append(st.replicas, rp)
	sort.Slice(st.replicas, func(i, j int) bool {
		if st.replicas[i].slot != st.replicas[j].slot {
			return st.replicas[i].slot < st.replicas[j].slot
		}
		return st.replicas[i].name < st.replicas[j].name
	})
	go rp.run(r.replicaCtx)
	return rp
}

func (r *Runner) retire(st *deployment, rp *replica) {
	rp.stop()
	st.replicas = slices.DeleteFunc(st.replicas, func(x *replica) bool { return x == rp })
	r.retired = append(r.retired, rp)
}

func (r *Runner) retireAll(st *deployment) {
	for _, rp := range slices.Clone(st.replicas) {
		r.retire(st, rp)
	}
}
