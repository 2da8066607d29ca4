package failpoint

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// envHelper makes the test binary the process that reaches a step.
const envHelper = "FAILPOINT_TEST_HELPER"

// A process reaching its armed step ends there, as SIGKILLed, with nothing
// after the step run: an ordinary process by the signal itself, and the init
// of a PID namespace (a container's entrypoint, which the kernel does not
// let SIGKILL itself) with the status of a SIGKILLed process.
func TestKillEndsTheProcessAtItsStep(t *testing.T) {
	for _, c := range []struct {
		name string
		init bool
	}{{"an ordinary process", false}, {"the init of a PID namespace", true}} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperReachesTheStep$")
			cmd.Env = append(os.Environ(), envHelper+"=1", Env+"="+SweepAfterLedgerCancel)
			if c.init {
				cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
			}
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if c.init && err != nil && !errors.As(err, &exit) {
				t.Skipf("cannot start a process in a PID namespace of its own here: %v", err)
			}
			if !strings.Contains(string(out), "before the step") || strings.Contains(string(out), "after the step") {
				t.Fatalf("the process did not stop at the step: %v\n%s", err, out)
			}
			ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
			switch {
			case !c.init && (!ws.Signaled() || ws.Signal() != syscall.SIGKILL):
				t.Fatalf("ended with %v (%s), want killed by SIGKILL", err, out)
			case c.init && (!ws.Exited() || ws.ExitStatus() != 137):
				t.Fatalf("ended with %v (%s), want exit status 137 (128+SIGKILL)", err, out)
			}
		})
	}
}

// TestHelperReachesTheStep is the process of TestKillEndsTheProcessAtItsStep.
func TestHelperReachesTheStep(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("run by TestKillEndsTheProcessAtItsStep")
	}
	os.Stdout.WriteString("before the step\n")
	Kill(SweepAfterLedgerCancel)
	os.Stdout.WriteString("after the step\n")
}
