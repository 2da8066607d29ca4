package stock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Gate states stored in a shard's meta. Only OPEN admits reservations.
const (
	StateOpen       = "OPEN"
	StateNotStarted = "NOT_STARTED"
	StatePaused     = "PAUSED"
	StateEnded      = "ENDED"
	StateRebuilding = "REBUILDING"
	// StateFailClosed is written by the controller when Redis can no longer be
	// trusted (e.g. it restarted from an old snapshot) until the rebuild.
	StateFailClosed = "FAIL_CLOSED"
)

// Closed reasons returned by the reserve script besides the gate states.
const (
	ReasonNoMeta     = "NO_META"
	ReasonStaleEpoch = "STALE_EPOCH"
	// ReasonUnverified: the shard's data was written by another server process
	// than the one holding it now (a restart from a snapshot, a promoted
	// replica), so it may be older than the ledger: closed until rebuilt.
	ReasonUnverified = "UNVERIFIED"
)

// Gate outcomes per shard.
const (
	GateSet        = 1
	GateNoMeta     = 0
	GateStale      = -1
	GateRebuilding = -2
	// GateFailedClosed: the shard failed closed, and only the rebuild that
	// finished it moves it out of that (SetGateRebuilt).
	GateFailedClosed = -3
)

// ErrBadState is returned for a gate state the scripts do not know.
var ErrBadState = errors.New("unknown gate state")

// SetGate writes the gate state of every shard and returns the per-shard outcome
// (GateSet, GateNoMeta, GateStale, GateRebuilding, GateFailedClosed). epoch 0
// accepts any epoch. A shard failed closed keeps that state unless state is
// FAIL_CLOSED: it opens only once rebuilt, even when the reconcile that
// writes the gate found it open a moment before.
// Opening goes shard by shard and stops at the first that fails. Closing
// writes every shard at once, so that on a Redis Cluster a master that is
// down or hangs holds up only its own shards; the error names the first few
// shards that failed and counts the rest.
func (s *Store) SetGate(ctx context.Context, state string, epoch int64) ([]int, error) {
	return s.setGate(ctx, state, epoch, "", false)
}

// SetGateRebuilt is SetGate by the rebuild that finished every shard closed
// at epoch: it moves them out of FAIL_CLOSED.
func (s *Store) SetGateRebuilt(ctx context.Context, state string, epoch int64) ([]int, error) {
	return s.setGate(ctx, state, epoch, "", true)
}

// CloseOpen is SetGate of a closing state on the shards that are OPEN only:
// shards closed otherwise (failed closed) keep their state.
func (s *Store) CloseOpen(ctx context.Context, state string) ([]int, error) {
	if state == StateOpen {
		return nil, fmt.Errorf("%w: CloseOpen with %q", ErrBadState, state)
	}
	return s.setGate(ctx, state, 0, StateOpen, false)
}

func (s *Store) setGate(ctx context.Context, state string, epoch int64, from string, rebuilt bool) ([]int, error) {
	switch state {
	case StateOpen, StateNotStarted, StatePaused, StateEnded, StateFailClosed:
	default:
		return nil, fmt.Errorf("%w: %q", ErrBadState, state)
	}
	reopen := ""
	if rebuilt {
		reopen = "1"
	}
	out := make([]int, len(s.shards))
	gate := func(i int) error {
		n, err := gateScript.Run(ctx, s.rdb, []string{s.shards[i].Meta()}, state, epoch, from, reopen).Int()
		if err != nil {
			return fmt.Errorf("gate shard %d: %w", i, err)
		}
		out[i] = n
		return nil
	}
	if state == StateOpen {
		for i := range s.shards {
			if err := gate(i); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	if err := s.everyShard(gate); err != nil {
		return nil, err
	}
	return out, nil
}

// SetWindow writes the sale's schedule (zero times: no bound) into every
// shard that has a meta, where the reserve script enforces it by the Redis
// clock: outside it a shard refuses (CLOSED NOT_STARTED or ENDED) whatever
// its gate. It returns per shard 1 written or 0 no meta. Every shard is
// written at once, as a closing gate is.
func (s *Store) SetWindow(ctx context.Context, start, end time.Time) ([]int, error) {
	ms := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return strconv.FormatInt(windowMs(t), 10)
	}
	from, until := ms(start), ms(end)
	out := make([]int, len(s.shards))
	err := s.everyShard(func(i int) error {
		n, err := windowScript.Run(ctx, s.rdb, []string{s.shards[i].Meta()}, from, until).Int()
		if err != nil {
			return fmt.Errorf("window of shard %d: %w", i, err)
		}
		out[i] = n
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// everyShard runs write on every shard at once, so that on a Redis Cluster a
// master that is down or hangs holds up only its own shards. The error names
// the first few shards that failed and counts the rest.
func (s *Store) everyShard(write func(i int) error) error {
	errs := make([]error, len(s.shards))
	var wg sync.WaitGroup
	for i := range s.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = write(i)
		}()
	}
	wg.Wait()
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	// A short error: it ends up in the sale's conditions.
	const shown = 4
	switch {
	case len(failed) == 0:
		return nil
	case len(failed) > shown:
		return fmt.Errorf("%w (and %d more shards)", errors.Join(failed[:shown]...), len(failed)-shown)
	}
	return errors.Join(failed...)
}
