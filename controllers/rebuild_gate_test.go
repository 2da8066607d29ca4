package controllers_test

import (
	"bufio"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// A sale paused while its stock is rebuilt opens paused: the rebuild reads
// the spec of the moment its shards open, not the one it started with. Its
// shards are being rebuilt, so the reconcile that sees the pause has no open
// gate to close; opening them OPEN would admit buyers until the next
// reconcile closed them again. Every command the Redis server runs is
// watched (MONITOR, which shows the writes inside scripts too): no write may
// set a shard's state OPEN after the pause.
func TestPauseDuringARebuildIsKept(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	held, let := e.holdRebuild("pausing", 0)
	e.startController()
	t.Cleanup(let) // before the manager stops, which waits for the rebuild
	fs := e.openSale("pausing", 20)
	if err := r.RestartEmpty(); err != nil {
		t.Fatal(err)
	}
	<-held
	updateSpec(t, e.ns, "pausing", func(fs *flashsalev1alpha1.FlashSale) { fs.Spec.Paused = true })
	// The operator's cache has the pause before the rebuild goes on.
	deadline := time.Now().Add(settle)
	for {
		cur := &flashsalev1alpha1.FlashSale{}
		if err := e.reconciler.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "pausing"}, cur); err == nil && cur.Spec.Paused {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the operator's cache never saw the pause")
		}
		time.Sleep(50 * time.Millisecond)
	}
	lines := monitorRedis(t, r.Addr())
	let()
	e.waitFor("pausing", settle, "Paused after the rebuild", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.LastRebuild != nil && fs.Status.Phase == flashsalev1alpha1.PhasePaused
	})
	meta := `"` + stock.ShardKeys(string(fs.UID), 0).Meta() + `"`
	var paused bool
	for _, l := range lines() {
		if i := strings.Index(l, meta); i >= 0 {
			switch rest := l[i+len(meta):]; {
			case strings.HasPrefix(rest, ` "state" "OPEN"`):
				t.Fatalf("shard 0 of a paused sale was opened: %s", l)
			case strings.HasPrefix(rest, ` "state" "PAUSED"`):
				paused = true
			}
		}
	}
	if !paused {
		t.Fatal("no write paused shard 0: the watch saw nothing")
	}
}

// monitorRedis runs MONITOR on a connection of its own; the function it
// returns stops it and gives the command lines seen since.
func monitorRedis(t *testing.T, addr string) func() []string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if ok, err := rd.ReadString('\n'); err != nil || ok != "+OK\r\n" {
		t.Fatalf("MONITOR: %q %v", ok, err)
	}
	var mu sync.Mutex
	var lines []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			mu.Lock()
			lines = append(lines, strings.TrimRight(l, "\r\n"))
			mu.Unlock()
		}
	}()
	var once sync.Once
	stop := func() []string {
		once.Do(func() {
			_ = conn.Close()
			<-done
		})
		mu.Lock()
		defer mu.Unlock()
		return lines
	}
	t.Cleanup(func() { stop() })
	return stop
}

// Shards failed closed with no record of it in the ledger (the operator
// closed them on a loss, and the ledger did not answer when it recorded it)
// are rebuilt before they open again: reopened as they were, they would sell
// from the data the loss made suspect, which a failback to the server that
// held it before may since have made look verified.
func TestFailedClosedShardsAreRebuiltNotReopened(t *testing.T) {
	t.Parallel()
	r := testharness.RedisT(t)
	e := newEnv(t, r.Addr(), sharedPG)
	e.startController()
	fs := e.openSale("closed", 20)
	eng := e.engineFor(fs, r.Addr())
	e.reserve(eng, "held")
	if err := eng.FailClose(context.Background()); err != nil {
		t.Fatal(err)
	}
	fs = e.waitFor("closed", settle, "Open after a rebuild", func(fs *flashsalev1alpha1.FlashSale) bool {
		return fs.Status.Phase == flashsalev1alpha1.PhaseOpen && fs.Status.LastRebuild != nil
	})
	if fs.Status.Epoch != 2 || fs.Status.Reserved != 1 || fs.Status.Available != 19 {
		t.Fatalf("after the rebuild: epoch %d, reserved %d, available %d; want 2, 1, 19", fs.Status.Epoch, fs.Status.Reserved, fs.Status.Available)
	}
}
