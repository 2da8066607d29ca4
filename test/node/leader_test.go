package node_test

import (
	"strings"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/internal/cmd/manager"
	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
)

// TestTheOperatorLeadsThroughItsLease: config/default runs the manager with
// --leader-elect under the leader-election Role, which grants what client-go's
// Lease lock calls (get, create, update) and the core events its election
// records. Without a lease verb no manager would lead and every other test
// would time out on an unreconciled sale; this one names the cause. Without
// the events only an error is logged, so only this test sees it.
func TestTheOperatorLeadsThroughItsLease(t *testing.T) {
	needNode(t)
	ns := localenv.ManagerNamespace
	var holder string
	eventually(t, "a holder of the manager's Lease", func() bool {
		holder = strings.TrimSpace(kubectl(t, nil, "get", "lease", "-n", ns, manager.LeaderElectionID,
			"-o", "jsonpath={.spec.holderIdentity}", "--ignore-not-found"))
		return holder != ""
	})
	eventually(t, "the LeaderElection event of "+holder, func() bool {
		msgs := kubectl(t, nil, "get", "events", "-n", ns,
			"--field-selector", "reason=LeaderElection,involvedObject.kind=Lease,involvedObject.name="+manager.LeaderElectionID,
			"-o", "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}")
		return strings.Contains(msgs, holder+" became leader")
	})
}
