package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the name of a campaign's sweeper Lease.
func LeaseName(campaignID string) string { return "flashsale-sweeper-" + campaignID }

// Identity names this replica in a Lease: host name and pid, so two
// processes on one host (or a restarted one) never share an identity.
func Identity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s_%d", host, os.Getpid())
}

// LeaseTiming are the client-go leader-election durations.
type LeaseTiming struct {
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// DefaultLeaseTiming is what controller-runtime uses for managers.
var DefaultLeaseTiming = LeaseTiming{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}

// Lease elects the sweeper with a coordination.k8s.io Lease. Election runs in
// the background from the first Acquire; Acquire only reads its state.
type Lease struct {
	client              kubernetes.Interface
	namespace, name, id string
	timing              LeaseTiming
	log                 *slog.Logger

	current atomic.Pointer[leaderelection.LeaderElector] // the running round, nil between rounds
	once    sync.Once
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewLease prepares the Lease namespace/name held under identity id.
func NewLease(client kubernetes.Interface, namespace, name, id string, timing LeaseTiming, log *slog.Logger) (*Lease, error) {
	switch {
	case namespace == "":
		return nil, errors.New("lease: a namespace is required")
	case name == "" || id == "":
		return nil, errors.New("lease: a name and an identity are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Lease{client: client, namespace: namespace, name: name, id: id, timing: timing, log: log}, nil
}

// Kind implements Elector.
func (l *Lease) Kind() string { return "lease" }

// Acquire starts the election on its first call and reports whether this
// replica holds the Lease. client-go's IsLeader only compares the holder of
// the last record seen, and stays true while a renewal hangs on a lost
// connection; so leading also needs a renewal within RenewDeadline, which
// ends before another replica may take the Lease (LeaseDuration).
func (l *Lease) Acquire(context.Context) (bool, error) {
	l.once.Do(l.start)
	le := l.current.Load()
	return le != nil && le.IsLeader() && le.Check(l.timing.RenewDeadline-l.timing.LeaseDuration) == nil, nil
}

func (l *Lease) start() {
	// Its own context: the election must outlive the command's context so that
	// the Lease is released only after the last pass has finished.
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel, l.done = cancel, make(chan struct{})
	go func() {
		defer close(l.done)
		// Losing the Lease ends a round; run another, so this replica can lead
		// again later instead of exiting.
		for ctx.Err() == nil {
			if err := l.round(ctx); err != nil {
				l.log.Error("lease election", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(l.timing.RetryPeriod):
				}
			}
		}
	}()
}

func (l *Lease) round(ctx context.Context) error {
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: l.namespace, Name: l.name},
			Client:     l.client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: l.id},
		},
		LeaseDuration:   l.timing.LeaseDuration,
		RenewDeadline:   l.timing.RenewDeadline,
		RetryPeriod:     l.timing.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            l.name,
		// Leadership is read from the elector itself (IsLeader) while its round
		// runs: the callbacks run on their own goroutines and could be reordered.
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return err
	}
	l.current.Store(le)
	defer l.current.Store(nil)
	le.Run(ctx)
	return nil
}

// Release stops the election; client-go gives the Lease up (ReleaseOnCancel)
// so another replica takes over without waiting for it to expire.
func (l *Lease) Release(ctx context.Context) error {
	l.once.Do(func() {}) // an Acquire after Release must not start a new election
	if l.cancel == nil {
		return nil
	}
	l.cancel()
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("lease: release: %w", ctx.Err())
	}
}
