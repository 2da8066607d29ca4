package cpustat

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

func TestSelfAndProcessCountWhatRuns(t *testing.T) {
	// Spin until this process has had 300 ms of CPU: on a loaded machine
	// that takes longer than 300 ms of wall time. Self must see it, and
	// Process and MachineBusy must agree.
	s0, p0, m0 := Self(), Process(os.Getpid()), MachineBusy()
	for deadline := time.Now().Add(30 * time.Second); Self()-s0 < 300*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatalf("Self grew by %v over 30 s of spinning", Self()-s0)
		}
		spin(10 * time.Millisecond)
	}
	p1, m1 := Process(os.Getpid()), MachineBusy()
	if d := p1 - p0; d < 250*time.Millisecond {
		t.Errorf("Process grew by %v while Self grew by 300 ms or more", d)
	}
	if d := m1 - m0; d < 250*time.Millisecond {
		t.Errorf("MachineBusy grew by %v while Self grew by 300 ms or more", d)
	}
	if Process(-1) != 0 {
		t.Error("a pid that does not exist has CPU time")
	}
}

func TestTreeCountsChildren(t *testing.T) {
	// A child that spins: this process's tree counts it, the process alone does not.
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperSpin$")
	cmd.Env = append(os.Environ(), "CPUSTAT_SPIN=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); Process(cmd.Process.Pid) < 200*time.Millisecond; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the child never used 200 ms of CPU")
		}
	}
	if !slices.Contains(Children(os.Getpid()), cmd.Process.Pid) {
		t.Fatalf("children %v lack %d", Children(os.Getpid()), cmd.Process.Pid)
	}
	// Own CPU first: it only grows, so a later tree minus it is no less than
	// the child's CPU (the other order under-counts by what this process spent
	// between the two reads).
	if own := Process(os.Getpid()); Tree(os.Getpid())-own < 200*time.Millisecond {
		t.Errorf("tree %v, process %v: the child's CPU is missing", Tree(os.Getpid()), own)
	}
}

func TestHelperSpin(t *testing.T) {
	if os.Getenv("CPUSTAT_SPIN") == "" {
		t.Skip("helper process")
	}
	spin(time.Minute)
}
