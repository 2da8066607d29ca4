package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
)

// phaseWatch is `kubectl get flashsale -w`, printing the phase of every update.
type phaseWatch struct {
	mu     sync.Mutex
	phases []string
}

func watchPhases(t *testing.T, ns, name string) *phaseWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, env.KubectlBin, "get", "flashsale", name, "-n", ns, "-w",
		"-o", `jsonpath={.status.phase}{"\n"}`)
	cmd.Env = env.KubectlEnv()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &phaseWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.mu.Lock()
			w.phases = append(w.phases, strings.TrimSpace(sc.Text()))
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = cmd.Wait()
	})
	return w
}

func (w *phaseWatch) seen() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.phases)
}

// Redis loses everything in the middle of a storm: every shard refuses at
// once, the status says FailClosed, the controller rebuilds the stock from the
// ledger, the storm goes on, the audit is exact, and reservations acknowledged
// before the loss can still be paid for.
func TestRedisLostMidStormIsRebuiltFromTheLedger(t *testing.T) {
	t.Parallel()
	storms.Lock()
	defer storms.Unlock()
	// A Redis of its own, so that no other test's sale loses its data.
	rs, err := env.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	ns := namespaceName("redis-loss")
	newNamespace(t, ns, rs.Addr())
	s := applySale(t, ns, "redis-loss.yaml", nil)

	held := map[*buyer]string{}
	for i := range 5 {
		b := s.buyer(t, fmt.Sprintf("holder-%d", i))
		a := b.reserve(t, "before-the-loss")
		if a.Status != http.StatusCreated {
			t.Fatalf("reserve before the loss: %+v", a)
		}
		held[b] = a.ReservationID
	}
	phases := watchPhases(t, ns, s.name)

	st := s.startStorm(t, "--buyers", "100000", "--duration", "20s", "--concurrency", "16",
		"--checkout-ratio", "0.8", "--cancel-ratio", "0.2", "--settle", "60s")
	time.Sleep(3 * time.Second)
	if err := rs.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	t.Log("Redis restarted empty")

	var rebuiltAt time.Time
	eventually(t, 30*time.Second, 100*time.Millisecond, func() string {
		fs := getSale(t, ns, s.name)
		if fs.Status.LastRebuild == nil || fs.Status.Epoch < 2 || fs.Status.Phase != "Open" {
			return fmt.Sprintf("not rebuilt yet: phase %s, epoch %d, last rebuild %+v", fs.Status.Phase, fs.Status.Epoch, fs.Status.LastRebuild)
		}
		rebuiltAt = fs.Status.LastRebuild.Time.Time
		t.Logf("rebuilt: epoch %d, %+v", fs.Status.Epoch, *fs.Status.LastRebuild)
		return ""
	})
	eventually(t, 5*time.Second, 100*time.Millisecond, func() string {
		if !slices.Contains(phases.seen(), "FailClosed") {
			return fmt.Sprintf("kubectl get -w never showed FailClosed; phases seen: %v", phases.seen())
		}
		return ""
	})
	if ev := kubectl(t, nil, "get", "events", "-n", ns, "--field-selector", "reason=RedisDataLost", "-o", "name"); strings.TrimSpace(ev) == "" {
		t.Error("no RedisDataLost event")
	}

	for b, id := range held {
		if a := b.checkout(t, id); a.Status != http.StatusOK || a.OrderStatus != "confirmed" {
			t.Errorf("%s checking out %s, acknowledged before the loss: %+v", b.user, id, a)
		}
	}

	rep := st.report(t)
	salecheck.Audit(t, rep)
	if !rep.Audit.Settled || rep.Audit.Reserved != 0 || rep.Audit.Pending != 0 {
		t.Fatalf("not settled: reserved %d, pending %d", rep.Audit.Reserved, rep.Audit.Pending)
	}
	// The storm went on after the rebuild (whose time the status gives to the
	// second, hence the second added).
	var after int
	if err := ledger.QueryRow(context.Background(),
		`SELECT count(*) FROM flashsale_orders WHERE campaign_id = $1 AND created_at > $2`, s.uid, rebuiltAt.Add(time.Second)).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after == 0 {
		t.Error("no reservation was made after the rebuild: the storm did not go on")
	}
	ids := make([]string, 0, len(held))
	for _, id := range held {
		ids = append(ids, id)
	}
	for id, status := range salecheck.Statuses(t, ledger, ids) {
		if status != "COMMITTED" {
			t.Errorf("reservation %s held across the loss is %s in the ledger", id, status)
		}
	}
	units := salecheck.Units(t, ledger, s.uid)
	wantSold := rep.Audit.Sold
	if units["COMMITTED"] != wantSold || units["PENDING"] != 0 {
		t.Errorf("ledger %v, audit sold %d", units, wantSold)
	}
	eventually(t, 10*time.Second, 250*time.Millisecond, func() string {
		fs := getSale(t, ns, s.name)
		if fs.Status.Sold != wantSold || fs.Status.Reserved != 0 || fs.Status.Available != fs.Spec.Allocation-wantSold {
			return fmt.Sprintf("status available %d reserved %d sold %d, want sold %d of %d", fs.Status.Available, fs.Status.Reserved, fs.Status.Sold, wantSold, fs.Spec.Allocation)
		}
		return ""
	})
}
