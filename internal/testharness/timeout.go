package testharness

import (
	"flag"
	"fmt"
	"os"
	"time"
)

// BeforeTimeout runs stop, then exits with status 1, shortly before the test
// binary's -test.timeout ends it: the testing package's timeout panics
// without running deferred calls or cleanups, so a TestMain's servers (a
// whole node: containerd, its shims and pods, mounts, a network namespace)
// would be left running until the next run sweeps them. The margin is a
// third of the limit, at most two minutes. The returned func cancels it; call
// it once the tests are over. Once the stop has begun, it waits for the stop
// to end the process instead, so the tests' own ending (logs kept again,
// servers closed twice) does not race it. Without a limit (-test.timeout 0)
// it does nothing.
func BeforeTimeout(stop func()) (cancel func()) {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return func() {}
	}
	limit, _ := f.Value.(flag.Getter).Get().(time.Duration)
	return beforeTimeout(limit, min(2*time.Minute, limit/3), stop, os.Exit)
}

func beforeTimeout(limit, margin time.Duration, stop func(), exit func(int)) (cancel func()) {
	if limit <= 0 {
		return func() {}
	}
	t := time.AfterFunc(limit-margin, func() {
		fmt.Fprintf(os.Stderr, "stopping the test servers %s before the binary's time limit (-test.timeout %s)\n", margin, limit)
		stop()
		exit(1)
	})
	return func() {
		if !t.Stop() {
			select {} // the stop runs and exits the process
		}
	}
}

// StopBeforeTimeout is BeforeTimeout for a TestMain's environment: it keeps
// the logs under dir (KeepLogs), then runs stop, then closes what the harness
// started.
func StopBeforeTimeout(kind, dir string, stop func() error) (cancel func()) {
	return BeforeTimeout(func() {
		if kept, err := KeepLogs(kind, dir); err == nil {
			fmt.Fprintf(os.Stderr, "the %s run's logs are kept in %s\n", kind, kept)
		}
		if err := stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the %s environment: %v\n", kind, err)
		}
		_ = CloseAll()
	})
}
