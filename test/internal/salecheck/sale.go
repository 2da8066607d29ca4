package salecheck

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
)

// Sale is a sale under test as both suites reach it: kubectl against their
// environment, its reserve Service's URL (through the pod runner, or the
// ClusterIP through kube-proxy), the key that signs its admission tokens.
// The sequences of checks both suites run take one.
type Sale struct {
	Env                          *localenv.Env
	NS, Name, UID, SKU, URL, Key string // Key: the admission key's file
}

// kubectl runs kubectl and fails the test on error.
func (s *Sale) kubectl(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := s.Env.Kubectl(ctx, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Get reads the FlashSale with kubectl.
func (s *Sale) Get(t testing.TB) *flashsalev1alpha1.FlashSale {
	t.Helper()
	var fs flashsalev1alpha1.FlashSale
	if err := json.Unmarshal([]byte(s.kubectl(t, "get", "flashsale", s.Name, "-n", s.NS, "-o", "json")), &fs); err != nil {
		t.Fatal(err)
	}
	return &fs
}

// Patch merge-patches the FlashSale's spec with kubectl.
func (s *Sale) Patch(t testing.TB, spec string) {
	t.Helper()
	s.kubectl(t, "patch", "flashsale", s.Name, "-n", s.NS, "--type", "merge", "-p", `{"spec":`+spec+`}`)
}

// Buyer is one buyer of the sale, calling its reserve Service.
func (s *Sale) Buyer(t testing.TB, user string) *Buyer {
	t.Helper()
	return NewBuyer(t, s.Env.Binary, s.Key, s.URL, s.SKU, user, s.Env.HTTPClient(10*time.Second))
}

// WaitPhase waits for the sale's phase; on a timeout it shows the status.
func (s *Sale) WaitPhase(t testing.TB, phase flashsalev1alpha1.FlashSalePhase, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, 200*time.Millisecond, func() string {
		if fs := s.Get(t); fs.Status.Phase != phase {
			st, _ := json.Marshal(fs.Status)
			return fmt.Sprintf("phase %s, want %s; status %s", fs.Status.Phase, phase, st)
		}
		return ""
	})
}

// Eventually polls cond every interval until it returns "" or timeout
// passes, and then fails the test with cond's last answer.
func Eventually(t testing.TB, timeout, interval time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, msg)
		}
		time.Sleep(interval)
	}
}

// PhaseWatch is `kubectl get flashsale -w`, recording the phase of every
// update (a phase the status holds for less than a refresh would be missed
// by polling).
type PhaseWatch struct {
	mu     sync.Mutex
	phases []string
}

// WatchPhases starts watching the sale's phase until the test ends.
func (s *Sale) WatchPhases(t testing.TB) *PhaseWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, s.Env.KubectlBin, "get", "flashsale", s.Name, "-n", s.NS, "-w", "-o", `jsonpath={.status.phase}{"\n"}`)
	cmd.Env = s.Env.KubectlEnv()
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &PhaseWatch{}
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

// Seen lists the phases watched so far.
func (w *PhaseWatch) Seen() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.phases)
}
