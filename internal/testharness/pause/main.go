// Command pause is the test node's pod sandbox process (the image containerd
// knows as registry.k8s.io/pause): it holds the pod's namespaces and waits
// for SIGTERM or SIGINT. It is built from source with the rest of the test
// node, so no image needs to be pulled.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
