package podrunner

import "testing"

// Replicas started together must not be handed one port: the kernel gives a
// port just closed to a later bind(0) often enough that, without the runner's
// own memory, two of a thousand ports drawn in a row come out the same.
func TestFreePortNeverHandsOutAPortTwice(t *testing.T) {
	seen := map[int]int{}
	for i := range 1000 {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if j, ok := seen[p]; ok {
			t.Fatalf("port %d handed out by call %d and again by call %d", p, j, i)
		}
		seen[p] = i
	}
}
